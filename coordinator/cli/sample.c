/* `sample`: text from a stored version, so a person can read what the model
 * learned rather than only its losses.
 *
 * Generation runs the CPU model one byte at a time on the last block_size
 * bytes: the model has no key/value cache, and at the sizes a person reads
 * (a few hundred bytes) recomputing the window costs less than a second on
 * the demo model. Sampling draws from softmax(logits / temperature) in
 * double by the inverse CDF with the project's seeded RNG, so a seed gives
 * the same text on every machine whose float products agree. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "coordinator/coord.h"
#include "coordinator/cli/cli.h"
#include "coordinator/config/config.h"

/* The byte the model continues with, from logits[V]: the argmax at
 * temperature 0 (lowest byte on ties), else a draw. */
static int pick(const float *logits, int V, double temperature, vl_rng *r) {
    int best = 0;
    for (int i = 1; i < V; i++)
        if (logits[i] > logits[best]) best = i;
    if (temperature == 0) return best;
    double total = 0;
    double p[256];
    for (int i = 0; i < V; i++) {
        p[i] = exp(((double)logits[i] - logits[best]) / temperature);
        total += p[i];
    }
    double u = (double)vl_rng_uniform(r) * total, acc = 0;
    for (int i = 0; i < V; i++) {
        acc += p[i];
        if (u < acc) return i;
    }
    return best; /* u rounded up to total */
}

/* One byte as text that cannot drive a terminal; a backslash is escaped
 * too, so the text reads back unambiguously. */
static void put_byte(int b, FILE *out) {
    if (b == '\n' || b == '\t' || (b >= 0x20 && b < 0x7f && b != '\\'))
        fputc(b, out);
    else
        fprintf(out, "\\x%02x", (unsigned)b);
}

int coord_cmd_sample(const char *db_path, int64_t version, const coord_sample_opts *o, FILE *out,
                     int64_t *sampled, double *val_loss, vl_error *err) {
    if (!o || !o->prompt || !o->prompt[0])
        return vl_fail(err, VL_EINVAL, "sample: the prompt is empty");
    if (o->tokens < 1 || o->tokens > COORD_SAMPLE_MAX_TOKENS)
        return vl_fail(err, VL_EINVAL, "sample: --tokens must be 1..%d", COORD_SAMPLE_MAX_TOKENS);
    if (!(o->temperature >= 0 && o->temperature <= COORD_SAMPLE_MAX_TEMP))
        return vl_fail(err, VL_EINVAL, "sample: --temperature must be 0..%g",
                       COORD_SAMPLE_MAX_TEMP);
    coord_config cfg;
    model_gpt *gpt = NULL;
    double vloss = NAN;
    int rc = coord_load_version(db_path, &version, &cfg, &gpt, &vloss, err);
    if (rc != VL_OK) return rc;
    int V = cfg.model.vocab_size, T = cfg.model.block_size;
    if (V != 256) {
        model_gpt_free(gpt);
        return vl_fail(err, VL_EINVAL,
                       "sample: the run's model has a vocabulary of %d tokens; sample reads and "
                       "writes bytes (vocabulary 256). Export it and use a GPT-2 tokenizer",
                       V);
    }
    size_t plen = strlen(o->prompt);
    size_t cap = plen + (size_t)o->tokens;
    int *toks = malloc(cap * sizeof *toks);
    if (!toks) {
        model_gpt_free(gpt);
        return vl_fail(err, VL_ENOMEM, "sample: out of memory");
    }
    for (size_t i = 0; i < plen; i++) toks[i] = (unsigned char)o->prompt[i];
    vl_rng r;
    vl_rng_seed(&r, o->seed);
    for (size_t i = 0; i < plen; i++) put_byte(toks[i], out);
    size_t n = plen;
    for (int64_t k = 0; k < o->tokens && rc == VL_OK; k++) {
        int len = n > (size_t)T ? T : (int)n;
        rc = model_gpt_forward(gpt, toks + n - (size_t)len, NULL, 1, len, NULL, err);
        if (rc != VL_OK) break;
        const float *logits = model_gpt_output(gpt) + (size_t)(len - 1) * (size_t)V;
        toks[n] = pick(logits, V, o->temperature, &r);
        put_byte(toks[n], out);
        n++;
    }
    fputc('\n', out);
    free(toks);
    model_gpt_free(gpt);
    if (rc != VL_OK) return rc;
    if (fflush(out) != 0 || ferror(out)) return vl_fail(err, VL_EIO, "sample: writing failed");
    if (sampled) *sampled = version;
    if (val_loss) *val_loss = vloss;
    return VL_OK;
}
