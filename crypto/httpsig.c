/* RFC 9421 HTTP Message Signatures (alg ed25519) and RFC 9530
 * Content-Digest: the strict RFC 8941 structured-field parsing both need,
 * the signature base, signing and verifying, and body digests on
 * OpenSSL's EVP (which uses the CPU's SHA extensions where they exist). */
#include <ctype.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/types.h>

#include <openssl/evp.h>
#include <sodium.h>

#include "crypto/crypto.h"

/* ---- body digests ---------------------------------------------------------- */

struct vcrypto_digest {
    EVP_MD_CTX *ctx;
};

static const EVP_MD *digest_md(vcrypto_digest_alg alg) {
    return alg == VCRYPTO_DIGEST_SHA512   ? EVP_sha512()
           : alg == VCRYPTO_DIGEST_SHA256 ? EVP_sha256()
                                          : NULL;
}

vcrypto_digest *vcrypto_digest_new(vcrypto_digest_alg alg) {
    vcrypto_digest *d = calloc(1, sizeof *d);
    if (!d) return NULL;
    d->ctx = EVP_MD_CTX_new();
    if (!d->ctx || vcrypto_digest_reset(d, alg) != VL_OK) {
        vcrypto_digest_free(d);
        return NULL;
    }
    return d;
}

int vcrypto_digest_reset(vcrypto_digest *d, vcrypto_digest_alg alg) {
    const EVP_MD *md = digest_md(alg);
    if (!md || EVP_DigestInit_ex(d->ctx, md, NULL) != 1) return VL_ERR;
    return VL_OK;
}

void vcrypto_digest_update(vcrypto_digest *d, const void *data, size_t len) {
    if (len > 0) EVP_DigestUpdate(d->ctx, data, len);
}

size_t vcrypto_digest_final(vcrypto_digest *d, uint8_t out[VCRYPTO_DIGEST_MAX]) {
    unsigned n = 0;
    if (EVP_DigestFinal_ex(d->ctx, out, &n) != 1) return 0;
    return n;
}

void vcrypto_digest_free(vcrypto_digest *d) {
    if (!d) return;
    EVP_MD_CTX_free(d->ctx);
    free(d);
}

int vcrypto_content_digest(const void *body, size_t len, char *out, size_t cap) {
    uint8_t md[VCRYPTO_DIGEST_MAX];
    unsigned n = 0;
    if (EVP_Digest(len ? body : "", len, md, &n, EVP_sha256(), NULL) != 1) return VL_ERR;
    char b64[96];
    vl_base64_encode(md, n, b64);
    int w = snprintf(out, cap, "sha-256=:%s:", b64);
    return w < 0 || (size_t)w >= cap ? VL_ETOOBIG : VL_OK;
}

void vcrypto_nonce_key(const char *nonce, char out[VCRYPTO_NONCE_HEX + 1]) {
    uint8_t md[VCRYPTO_DIGEST_MAX];
    unsigned n = 0;
    if (EVP_Digest(nonce, strlen(nonce), md, &n, EVP_sha256(), NULL) != 1)
        memset(md, 0, sizeof md); /* cannot happen with a built-in digest */
    vl_hex_encode(md, VCRYPTO_NONCE_HEX / 2, out);
}

/* ---- RFC 8941 structured fields, as far as these headers need ---------- */

/* A cursor over one field value. Every reader stops at end; none reads a
 * byte past it. */
typedef struct sf {
    const char *p, *end;
} sf;

static int sf_at(const sf *s, char c) {
    return s->p < s->end && *s->p == c;
}
static void sf_sp(sf *s) {
    while (s->p < s->end && *s->p == ' ') s->p++;
}
static void sf_ows(sf *s) {
    while (s->p < s->end && (*s->p == ' ' || *s->p == '\t')) s->p++;
}
static int lcalpha(char c) {
    return c >= 'a' && c <= 'z';
}
static int digit(char c) {
    return c >= '0' && c <= '9';
}

/* key = ( lcalpha / "*" ) *( lcalpha / DIGIT / "_" / "-" / "." / "*" ) */
static int sf_key(sf *s, char *out, size_t cap) {
    size_t n = 0;
    if (!(s->p < s->end && (lcalpha(*s->p) || *s->p == '*'))) return -1;
    while (s->p < s->end && (lcalpha(*s->p) || digit(*s->p) || strchr("_-.*", *s->p))) {
        if (n + 1 >= cap) return -1;
        out[n++] = *s->p++;
    }
    out[n] = '\0';
    return 0;
}

/* A string item, unescaped into out. Only printable ASCII is allowed. */
static int sf_string(sf *s, char *out, size_t cap) {
    if (!sf_at(s, '"')) return -1;
    s->p++;
    size_t n = 0;
    while (s->p < s->end) {
        char c = *s->p++;
        if (c == '\\') {
            if (s->p >= s->end || (*s->p != '"' && *s->p != '\\')) return -1;
            c = *s->p++;
        } else if (c == '"') {
            out[n] = '\0';
            return 0;
        } else if (c < 0x20 || c > 0x7e) {
            return -1;
        }
        if (n + 1 >= cap) return -1;
        out[n++] = c;
    }
    return -1; /* no closing quote */
}

/* An integer item: an optional minus and 1 to 15 digits. */
static int sf_integer(sf *s, int64_t *out) {
    int neg = sf_at(s, '-');
    if (neg) s->p++;
    int64_t v = 0;
    int n = 0;
    while (s->p < s->end && digit(*s->p)) {
        if (++n > 15) return -1;
        v = v * 10 + (*s->p++ - '0');
    }
    if (n == 0 || sf_at(s, '.')) return -1; /* decimals are not integers */
    *out = neg ? -v : v;
    return 0;
}

/* A byte sequence item ":base64:" decoded into out; *n gets its length. */
static int sf_bytes(sf *s, uint8_t *out, size_t cap, size_t *n) {
    if (!sf_at(s, ':')) return -1;
    const char *start = ++s->p;
    while (s->p < s->end && *s->p != ':') {
        char c = *s->p;
        if (!(isalnum((unsigned char)c) || c == '+' || c == '/' || c == '=')) return -1;
        s->p++;
    }
    if (!sf_at(s, ':')) return -1;
    long got = vl_base64_decode(start, (size_t)(s->p - start), out, cap);
    s->p++;
    if (got < 0) return -1;
    *n = (size_t)got;
    return 0;
}

/* Any bare item, skipped: what a field we do not read holds. */
static int sf_skip_bare(sf *s) {
    if (s->p >= s->end) return -1;
    char c = *s->p;
    if (c == '"') {
        for (s->p++; s->p < s->end; s->p++) {
            if (*s->p == '\\') {
                if (++s->p >= s->end || (*s->p != '"' && *s->p != '\\')) return -1;
            } else if (*s->p == '"') {
                s->p++;
                return 0;
            } else if (*s->p < 0x20 || *s->p > 0x7e) {
                return -1;
            }
        }
        return -1;
    }
    if (c == ':') {
        for (s->p++; s->p < s->end && *s->p != ':'; s->p++)
            if (!isalnum((unsigned char)*s->p) && !strchr("+/=", *s->p)) return -1;
        if (!sf_at(s, ':')) return -1;
        s->p++;
        return 0;
    }
    if (c == '?') {
        if (s->end - s->p < 2 || (s->p[1] != '0' && s->p[1] != '1')) return -1;
        s->p += 2;
        return 0;
    }
    if (c == '-' || digit(c)) {
        if (c == '-') s->p++;
        int n = 0;
        while (s->p < s->end && (digit(*s->p) || *s->p == '.')) s->p++, n++;
        return n > 0 ? 0 : -1;
    }
    if (isalpha((unsigned char)c) || c == '*') { /* token */
        while (s->p < s->end &&
               (isalnum((unsigned char)*s->p) || strchr("!#$%&'*+-.^_`|~:/", *s->p)))
            s->p++;
        return 0;
    }
    return -1;
}

static int sf_skip_params(sf *s) {
    while (sf_at(s, ';')) {
        s->p++;
        sf_sp(s);
        char k[64];
        if (sf_key(s, k, sizeof k) != 0) return -1;
        if (sf_at(s, '=')) {
            s->p++;
            if (sf_skip_bare(s) != 0) return -1;
        }
    }
    return 0;
}

/* A member value of any shape: an inner list or an item, with parameters. */
static int sf_skip_value(sf *s) {
    if (sf_at(s, '(')) {
        s->p++;
        for (;;) {
            sf_sp(s);
            if (sf_at(s, ')')) {
                s->p++;
                break;
            }
            if (sf_skip_bare(s) != 0 || sf_skip_params(s) != 0) return -1;
            if (!sf_at(s, ' ') && !sf_at(s, ')')) return -1;
        }
    } else if (sf_skip_bare(s) != 0) {
        return -1;
    }
    return sf_skip_params(s);
}

/* After a dictionary member: the end, or OWS "," OWS and another member. */
static int sf_next_member(sf *s, int *more) {
    sf_ows(s);
    if (s->p >= s->end) {
        *more = 0;
        return 0;
    }
    if (!sf_at(s, ',')) return -1;
    s->p++;
    sf_ows(s);
    if (s->p >= s->end) return -1; /* a trailing comma */
    *more = 1;
    return 0;
}

static sf sf_of(const char *v) {
    sf s = {v, v + strlen(v)};
    sf_sp(&s);
    while (s.end > s.p && s.end[-1] == ' ') s.end--;
    return s;
}

/* ---- Content-Digest ----------------------------------------------------- */

int vcrypto_digest_parse(const char *value, vcrypto_digest_want *out, vl_error *err) {
    memset(out, 0, sizeof *out);
    if (!value || strnlen(value, VCRYPTO_DIGEST_HEADER_MAX) >= VCRYPTO_DIGEST_HEADER_MAX)
        return vl_fail(err, VL_EINVAL, "missing, or longer than %d bytes",
                       VCRYPTO_DIGEST_HEADER_MAX - 1);
    sf s = sf_of(value);
    vcrypto_digest_want sha512 = {0};
    int more = s.p < s.end;
    if (!more) return vl_fail(err, VL_EINVAL, "empty");
    while (more) {
        char key[32];
        if (sf_key(&s, key, sizeof key) != 0)
            return vl_fail(err, VL_EINVAL, "not a dictionary of digests");
        int is256 = strcmp(key, "sha-256") == 0, is512 = strcmp(key, "sha-512") == 0;
        int bare = !sf_at(&s, '='); /* a boolean member: no digest at all */
        if (!bare) s.p++;
        if (bare && (is256 || is512)) {
            return vl_fail(err, VL_EINVAL, "%s must be a byte sequence of %d bytes", key,
                           is256 ? 32 : 64);
        } else if (bare) {
            if (sf_skip_params(&s) != 0) return vl_fail(err, VL_EINVAL, "malformed member %s", key);
        } else if (is256 || is512) {
            uint8_t b[VCRYPTO_DIGEST_MAX + 4];
            size_t n = 0;
            if (sf_bytes(&s, b, sizeof b, &n) != 0 || n != (is256 ? 32u : 64u) ||
                sf_skip_params(&s) != 0)
                return vl_fail(err, VL_EINVAL, "%s must be a byte sequence of %d bytes", key,
                               is256 ? 32 : 64);
            vcrypto_digest_want *w = is256 ? out : &sha512;
            w->alg = is256 ? VCRYPTO_DIGEST_SHA256 : VCRYPTO_DIGEST_SHA512;
            w->len = n;
            memcpy(w->bytes, b, n);
        } else if (sf_skip_value(&s) != 0) {
            return vl_fail(err, VL_EINVAL, "malformed member %s", key);
        }
        if (sf_next_member(&s, &more) != 0) return vl_fail(err, VL_EINVAL, "malformed dictionary");
    }
    if (out->alg == 0) *out = sha512;
    if (out->alg == 0) return vl_fail(err, VL_EINVAL, "names neither sha-256 nor sha-512");
    return VL_OK;
}

/* ---- Signature-Input and Signature ---------------------------------------- */

static int nonce_ok(const char *n) {
    size_t len = strlen(n);
    if (len < 16 || len > VCRYPTO_SIG_NONCE_MAX) return 0;
    for (size_t i = 0; i < len; i++)
        if (!isalnum((unsigned char)n[i]) && !strchr("+/=_.-", n[i])) return 0;
    return 1;
}

/* A component name: a derived one ("@" and lowercase letters or "-") or a
 * lowercase field name. */
static int component_ok(const char *c) {
    if (!*c) return 0;
    for (const char *p = c[0] == '@' ? c + 1 : c; *p; p++)
        if (!(lcalpha(*p) || (c[0] != '@' && (digit(*p) || strchr("!#$%&'*+-.^_`|~", *p))) ||
              *p == '-'))
            return 0;
    return c[0] != '@' || c[1] != '\0';
}

/* Each step keeps room for what must still follow: the closing quote and
 * the NUL (an escaped character takes two bytes). */
static int append_quoted(char *out, size_t cap, size_t *at, const char *v) {
    if (*at + 3 > cap) return -1;
    out[(*at)++] = '"';
    for (; *v; v++) {
        if (*at + 4 > cap) return -1;
        if (*v == '"' || *v == '\\') out[(*at)++] = '\\';
        out[(*at)++] = *v;
    }
    out[(*at)++] = '"';
    out[*at] = '\0';
    return 0;
}

static int append_int(char *out, size_t cap, size_t *at, const char *key, long long v) {
    int n = snprintf(out + *at, cap - *at, ";%s=%lld", key, v);
    if (n < 0 || (size_t)n >= cap - *at) return -1;
    *at += (size_t)n;
    return 0;
}

/* The parameters in the order they were given, as RFC 8941 serialises
 * them: what "@signature-params" is. */
typedef struct sig_param {
    char key[24];
    int is_int;
    int64_t i;
    const char *str;
} sig_param;

static int serialise_params(vcrypto_sig *s, const sig_param *ps, size_t n) {
    size_t at = 0;
    char *out = s->params;
    size_t cap = sizeof s->params;
    out[at++] = '(';
    for (size_t i = 0; i < s->n_components; i++) {
        if (i > 0) {
            if (at + 1 >= cap) return -1;
            out[at++] = ' ';
        }
        if (append_quoted(out, cap, &at, s->components[i]) != 0) return -1;
    }
    if (at + 2 >= cap) return -1;
    out[at++] = ')';
    out[at] = '\0';
    for (size_t i = 0; i < n; i++) {
        if (ps[i].is_int) {
            if (append_int(out, cap, &at, ps[i].key, (long long)ps[i].i) != 0) return -1;
        } else {
            int w = snprintf(out + at, cap - at, ";%s=", ps[i].key);
            if (w < 0 || (size_t)w >= cap - at) return -1;
            at += (size_t)w;
            if (append_quoted(out, cap, &at, ps[i].str) != 0) return -1;
        }
    }
    return 0;
}

/* The signature parameters after the inner list. */
static int parse_sig_params(sf *s, vcrypto_sig *out, sig_param *ps, size_t *np, int *has_created,
                            vl_error *err) {
    *np = 0;
    while (sf_at(s, ';')) {
        s->p++;
        sf_sp(s);
        char key[24];
        if (sf_key(s, key, sizeof key) != 0)
            return vl_fail(err, VL_EINVAL,
                           "Signature-Input: a malformed or unsupported "
                           "parameter name");
        if (!sf_at(s, '='))
            return vl_fail(err, VL_EINVAL, "Signature-Input: parameter %s has no value", key);
        s->p++;
        for (size_t i = 0; i < *np; i++)
            if (strcmp(ps[i].key, key) == 0)
                return vl_fail(err, VL_EINVAL, "Signature-Input: parameter %s given twice", key);
        if (*np >= 6) return vl_fail(err, VL_EINVAL, "Signature-Input: too many parameters");
        sig_param *p = &ps[(*np)++];
        memset(p, 0, sizeof *p);
        snprintf(p->key, sizeof p->key, "%s", key);
        char *dst = NULL;
        size_t cap = 0;
        if (strcmp(key, "created") == 0 || strcmp(key, "expires") == 0) {
            p->is_int = 1;
            if (sf_integer(s, &p->i) != 0 || p->i < 0)
                return vl_fail(err, VL_EINVAL,
                               "Signature-Input: %s must be a non-negative "
                               "integer",
                               key);
            if (key[0] == 'c') {
                out->created = p->i;
                *has_created = 1;
            } else {
                out->expires = p->i;
                out->has_expires = 1;
            }
            continue;
        }
        if (strcmp(key, "keyid") == 0)
            dst = out->keyid, cap = sizeof out->keyid;
        else if (strcmp(key, "nonce") == 0)
            dst = out->nonce, cap = sizeof out->nonce;
        else if (strcmp(key, "alg") == 0)
            dst = out->alg, cap = sizeof out->alg;
        else if (strcmp(key, "tag") == 0)
            dst = out->tag, cap = sizeof out->tag, out->has_tag = 1;
        else
            return vl_fail(err, VL_EINVAL, "Signature-Input: unsupported parameter %s", key);
        if (sf_string(s, dst, cap) != 0)
            return vl_fail(err, VL_EINVAL,
                           "Signature-Input: %s must be a string of at most %zu "
                           "characters",
                           key, cap - 1);
        p->str = dst;
    }
    return VL_OK;
}

static const sig_param *param_given(const sig_param *ps, size_t n, const char *key) {
    for (size_t i = 0; i < n; i++)
        if (strcmp(ps[i].key, key) == 0) return &ps[i];
    return NULL;
}

/* The inner list of covered components, its parameters, and the checks on
 * them. Presence is judged by the parameter, not its value, so nonce="" or
 * alg="" cannot pass for an absent one. */
static int parse_covered(sf *s, vcrypto_sig *out, vl_error *err) {
    if (!sf_at(s, '('))
        return vl_fail(err, VL_EINVAL, "Signature-Input: a member must be an inner list");
    s->p++;
    for (;;) {
        sf_sp(s);
        if (sf_at(s, ')')) {
            s->p++;
            break;
        }
        if (out->n_components >= VCRYPTO_SIG_MAX_COMPONENTS)
            return vl_fail(err, VL_EINVAL, "Signature-Input: more than %d components",
                           VCRYPTO_SIG_MAX_COMPONENTS);
        char *c = out->components[out->n_components];
        if (sf_string(s, c, VCRYPTO_SIG_NAME_MAX + 1) != 0 || !component_ok(c))
            return vl_fail(err, VL_EINVAL,
                           "Signature-Input: a component must be a quoted "
                           "lowercase name of at most %d characters",
                           VCRYPTO_SIG_NAME_MAX);
        if (sf_at(s, ';'))
            return vl_fail(err, VL_EINVAL,
                           "Signature-Input: component parameters (%s;...) "
                           "are not supported",
                           c);
        for (size_t i = 0; i < out->n_components; i++)
            if (strcmp(out->components[i], c) == 0)
                return vl_fail(err, VL_EINVAL, "Signature-Input: component %s given twice", c);
        out->n_components++;
        if (!sf_at(s, ' ') && !sf_at(s, ')'))
            return vl_fail(err, VL_EINVAL, "Signature-Input: malformed inner list");
    }
    sig_param ps[6];
    size_t np = 0;
    int has_created = 0;
    int rc = parse_sig_params(s, out, ps, &np, &has_created, err);
    if (rc != VL_OK) return rc;
    if (!has_created) return vl_fail(err, VL_EINVAL, "Signature-Input: created is required");
    if (!out->keyid[0]) return vl_fail(err, VL_EINVAL, "Signature-Input: keyid is required");
    if (param_given(ps, np, "nonce") && !nonce_ok(out->nonce))
        return vl_fail(err, VL_EINVAL,
                       "Signature-Input: a nonce is 16 to %d characters of "
                       "A-Z a-z 0-9 + / = _ . -",
                       VCRYPTO_SIG_NONCE_MAX);
    if (param_given(ps, np, "alg") && strcmp(out->alg, "ed25519") != 0)
        return vl_fail(err, VL_EINVAL, "Signature-Input: alg must be ed25519");
    if (serialise_params(out, ps, np) != 0)
        return vl_fail(err, VL_EINVAL, "Signature-Input: too long");
    return VL_OK;
}

/* More members than any honest client sends are refused, which bounds the
 * work and the label tables below. */
#define MAX_MEMBERS 8

static int label_seen(char (*labels)[VCRYPTO_SIG_NAME_MAX + 1], size_t n, const char *label) {
    for (size_t i = 0; i < n; i++)
        if (strcmp(labels[i], label) == 0) return 1;
    return 0;
}

/* The Signature dictionary: every label, and the bytes of those that hold
 * 64 (signatures of other algorithms, under labels we do not read, may be
 * any length). Duplicate labels are refused: RFC 8941 lets the last win,
 * and a proxy that lets the first win would see another signature. */
typedef struct sig_members {
    size_t n;
    char labels[MAX_MEMBERS][VCRYPTO_SIG_NAME_MAX + 1];
    size_t lens[MAX_MEMBERS];
    uint8_t sigs[MAX_MEMBERS][VCRYPTO_SIG_BYTES];
} sig_members;

static int parse_signatures(const char *signature, sig_members *m, vl_error *err) {
    sf s = sf_of(signature);
    int more = s.p < s.end;
    if (!more) return vl_fail(err, VL_EINVAL, "Signature is empty");
    while (more) {
        if (m->n >= MAX_MEMBERS)
            return vl_fail(err, VL_EINVAL, "Signature: more than %d members", MAX_MEMBERS);
        char *label = m->labels[m->n];
        if (sf_key(&s, label, sizeof m->labels[0]) != 0 || !sf_at(&s, '='))
            return vl_fail(err, VL_EINVAL, "Signature: not a dictionary");
        s.p++;
        if (label_seen(m->labels, m->n, label))
            return vl_fail(err, VL_EINVAL, "Signature: label %s given twice", label);
        uint8_t b[VCRYPTO_SIG_HEADER_MAX];
        size_t n = 0;
        if (sf_bytes(&s, b, sizeof b, &n) != 0 || sf_skip_params(&s) != 0)
            return vl_fail(err, VL_EINVAL, "Signature: a member must be a byte sequence");
        m->lens[m->n] = n;
        if (n == VCRYPTO_SIG_BYTES) memcpy(m->sigs[m->n], b, VCRYPTO_SIG_BYTES);
        m->n++;
        if (sf_next_member(&s, &more) != 0)
            return vl_fail(err, VL_EINVAL, "Signature: malformed dictionary");
    }
    return VL_OK;
}

/* How much a parsed member looks like volley's own signature: 2 for alg
 * "ed25519" with a keyid volley signs with (a peer id, or base64 of a
 * public key for a join), 1 for such a keyid without alg (RFC 9421 makes
 * alg optional), 0 for anything else (an intermediary's, say). */
static int volley_score(const vcrypto_sig *s) {
    size_t n = strlen(s->keyid);
    uint8_t pk[VCRYPTO_PK_BYTES];
    int ours = (n >= 1 && n <= 19 && strspn(s->keyid, "0123456789") == n) ||
               (n == VCRYPTO_PK_B64_LEN && vcrypto_pk_decode(s->keyid, pk) == VL_OK);
    if (!ours) return 0;
    return strcmp(s->alg, "ed25519") == 0 ? 2 : s->alg[0] == '\0' ? 1 : 0;
}

/* One Signature-Input member that has a Signature: what parsing it gave. */
typedef struct sig_candidate {
    int rc; /* parse_covered's, or VL_EINVAL for a signature of another length */
    vl_error err;
    vcrypto_sig sig;
} sig_candidate;

int vcrypto_sig_parse(const char *sig_input, const char *signature, vcrypto_sig *out,
                      vl_error *err) {
    memset(out, 0, sizeof *out);
    if (!sig_input || !signature)
        return vl_fail(err, VL_EINVAL, "missing Signature-Input or Signature");
    if (strnlen(sig_input, VCRYPTO_SIG_HEADER_MAX) >= VCRYPTO_SIG_HEADER_MAX ||
        strnlen(signature, VCRYPTO_SIG_HEADER_MAX) >= VCRYPTO_SIG_HEADER_MAX)
        return vl_fail(err, VL_EINVAL, "Signature-Input or Signature is longer than %d bytes",
                       VCRYPTO_SIG_HEADER_MAX - 1);
    /* The signatures first: their labels say which inputs can be read. */
    sig_members m;
    memset(&m, 0, sizeof m);
    int rc = parse_signatures(signature, &m, err);
    if (rc != VL_OK) return rc;
    char seen[MAX_MEMBERS][VCRYPTO_SIG_NAME_MAX + 1];
    size_t n_seen = 0;
    /* The first member with a signature (what is read when none is
     * volley's) and the best-scoring one so far. */
    sig_candidate first, best, cur;
    memset(&first, 0, sizeof first);
    memset(&best, 0, sizeof best);
    memset(&cur, 0, sizeof cur);
    int n_matched = 0, best_score = 0;
    sf s = sf_of(sig_input);
    int more = s.p < s.end;
    if (!more) return vl_fail(err, VL_EINVAL, "Signature-Input is empty");
    while (more) {
        if (n_seen >= MAX_MEMBERS)
            return vl_fail(err, VL_EINVAL, "Signature-Input: more than %d members", MAX_MEMBERS);
        char *label = seen[n_seen];
        if (sf_key(&s, label, sizeof seen[0]) != 0 || !sf_at(&s, '='))
            return vl_fail(err, VL_EINVAL, "Signature-Input: not a dictionary");
        s.p++;
        if (label_seen(seen, n_seen, label))
            return vl_fail(err, VL_EINVAL, "Signature-Input: label %s given twice", label);
        n_seen++;
        ssize_t match = -1;
        for (size_t i = 0; i < m.n; i++)
            if (strcmp(m.labels[i], label) == 0) match = (ssize_t)i;
        if (match >= 0) {
            /* Parsed on a copy of the cursor: a member that does not parse
             * as ours (another algorithm's parameters) is skipped as any
             * value, and only refuses the request if it is what is read. */
            sf at = s;
            memset(&cur, 0, sizeof cur);
            if (m.lens[match] != VCRYPTO_SIG_BYTES)
                cur.rc = vl_fail(&cur.err, VL_EINVAL,
                                 "Signature: an ed25519 signature is %d bytes, "
                                 "not %zu",
                                 VCRYPTO_SIG_BYTES, m.lens[match]);
            else
                cur.rc = parse_covered(&at, &cur.sig, &cur.err);
            if (cur.rc == VL_OK) {
                memcpy(cur.sig.label, label, strnlen(label, VCRYPTO_SIG_NAME_MAX));
                memcpy(cur.sig.sig, m.sigs[match], VCRYPTO_SIG_BYTES);
                s = at;
            } else if (sf_skip_value(&s) != 0) {
                if (n_matched == 0) return vl_fail(err, cur.rc, "%s", cur.err.msg);
                return vl_fail(err, VL_EINVAL, "Signature-Input: malformed member %s", label);
            }
            if (n_matched++ == 0) first = cur;
            int score = cur.rc == VL_OK ? volley_score(&cur.sig) : 0;
            if (score > best_score) {
                best_score = score;
                best = cur;
            }
        } else if (sf_skip_value(&s) != 0) {
            return vl_fail(err, VL_EINVAL, "Signature-Input: malformed member %s", label);
        }
        /* A member that did not parse as ours says best what is wrong
         * when the field breaks right after it. */
        if (sf_next_member(&s, &more) != 0)
            return match >= 0 && cur.rc != VL_OK
                       ? vl_fail(err, cur.rc, "%s", cur.err.msg)
                       : vl_fail(err, VL_EINVAL, "Signature-Input: malformed dictionary");
    }
    if (n_matched == 0) return vl_fail(err, VL_EINVAL, "no Signature-Input member has a Signature");
    const sig_candidate *c = best_score > 0 ? &best : &first;
    if (c->rc != VL_OK) return vl_fail(err, c->rc, "%s", c->err.msg);
    *out = c->sig;
    return VL_OK;
}

/* ---- the signature base ---------------------------------------------------- */

int vcrypto_sig_base(const vcrypto_sig *s, vcrypto_sig_lookup lookup, void *arg, vl_buf *out,
                     vl_error *err) {
    vl_buf_reset(out);
    for (size_t i = 0; i < s->n_components; i++) {
        const char *c = s->components[i];
        const char *v = lookup(arg, c);
        if (!v)
            return vl_fail(err, VL_EINVAL, "the signature covers %s, which the request lacks", c);
        for (const char *p = v; *p; p++)
            if ((unsigned char)*p < 0x20 || *p == 0x7f)
                return vl_fail(err, VL_EINVAL, "%s holds a control character", c);
        int rc = vl_buf_printf(out, "\"%s\": %s\n", c, v);
        if (rc) return rc == VL_ETOOBIG ? vl_fail(err, rc, "the signature base is too long") : rc;
    }
    int rc = vl_buf_printf(out, "\"@signature-params\": %s", s->params);
    if (rc) return rc == VL_ETOOBIG ? vl_fail(err, rc, "the signature base is too long") : rc;
    return VL_OK;
}

int vcrypto_sig_verify(const uint8_t pk[VCRYPTO_PK_BYTES], const vcrypto_sig *s, const vl_buf *base,
                       vl_error *err) {
    if (crypto_sign_verify_detached(s->sig, base->data, base->len, pk) != 0)
        return vl_fail(err, VL_EAUTH, "the signature does not verify");
    return VL_OK;
}

/* ---- signing --------------------------------------------------------------- */

/* A value that does not fit the scratch is no value (NULL) rather than a
 * truncated one: a signature over part of a path would cover nothing after
 * the cut. */
const char *vcrypto_http_request_lookup(void *arg, const char *c) {
    vcrypto_http_request *r = arg;
    size_t cap = sizeof r->scratch;
    if (!r->path_query) return NULL;
    const char *q = strchr(r->path_query, '?');
    size_t plen = q ? (size_t)(q - r->path_query) : strlen(r->path_query);
    if (strcmp(c, "@method") == 0) return r->method;
    if (strcmp(c, "@request-target") == 0) return r->path_query;
    if (strcmp(c, "@scheme") == 0) return "https";
    if (strcmp(c, "@path") == 0) {
        if (plen >= cap) return NULL;
        memcpy(r->scratch, r->path_query, plen);
        r->scratch[plen] = '\0';
        return r->scratch;
    }
    if (strcmp(c, "@query") == 0) {
        int n = snprintf(r->scratch, cap, "?%s", q ? q + 1 : "");
        return n < 0 || (size_t)n >= cap ? NULL : r->scratch;
    }
    if (strcmp(c, "@authority") == 0 || strcmp(c, "@target-uri") == 0) {
        char host[256];
        if (!r->authority || strlen(r->authority) >= sizeof host) return NULL;
        size_t i = 0;
        for (; r->authority[i]; i++) host[i] = (char)tolower((unsigned char)r->authority[i]);
        host[i] = '\0';
        int n = c[1] == 'a' ? snprintf(r->scratch, cap, "%s", host)
                            : snprintf(r->scratch, cap, "https://%s%s", host, r->path_query);
        return n < 0 || (size_t)n >= cap ? NULL : r->scratch;
    }
    if (strcmp(c, "content-digest") == 0) return r->content_digest;
    if (strcmp(c, "content-length") == 0) return r->content_length;
    return NULL;
}

int vcrypto_sign_http(const vcrypto_identity *id, const char *keyid, const char *method,
                      const char *path_query, int has_body, const void *body, size_t len,
                      int64_t created, vcrypto_signed_headers *out) {
    memset(out, 0, sizeof *out);
    /* created is bounded as the parser bounds integers (15 digits, not
     * negative), so what is signed here always parses there. */
    if (!method || !method[0] || !path_query || path_query[0] != '/' || !keyid || !keyid[0] ||
        strlen(keyid) > VCRYPTO_SIG_KEYID_MAX || (has_body && len > 0 && !body) || created < 0 ||
        created > INT64_C(999999999999999))
        return VL_EINVAL;
    for (const char *p = path_query; *p; p++)
        if (*p < 0x21 || *p > 0x7e) return VL_EINVAL;
    for (const char *p = method; *p; p++)
        if (*p < 0x21 || *p > 0x7e) return VL_EINVAL;
    /* keyid becomes a quoted string: printable ASCII only. */
    for (const char *p = keyid; *p; p++)
        if (*p < 0x20 || *p > 0x7e) return VL_EINVAL;
    vcrypto_sig s;
    memset(&s, 0, sizeof s);
    static const char *const names[] = {"@method", "@path", "@query", "content-digest",
                                        "content-length"};
    s.n_components = has_body ? 5 : 3;
    for (size_t i = 0; i < s.n_components; i++)
        snprintf(s.components[i], sizeof s.components[i], "%s", names[i]);
    char nonce[VCRYPTO_NONCE_HEX + 1];
    vcrypto_random_hex(VCRYPTO_NONCE_HEX / 2, nonce);
    snprintf(s.keyid, sizeof s.keyid, "%s", keyid);
    snprintf(s.nonce, sizeof s.nonce, "%s", nonce);
    snprintf(s.alg, sizeof s.alg, "ed25519");
    sig_param ps[4] = {{.key = "created", .is_int = 1, .i = created},
                       {.key = "keyid", .str = s.keyid},
                       {.key = "nonce", .str = s.nonce},
                       {.key = "alg", .str = s.alg}};
    if (serialise_params(&s, ps, 4) != 0) return VL_ETOOBIG;
    char clen[24];
    snprintf(clen, sizeof clen, "%zu", len);
    if (has_body &&
        vcrypto_content_digest(body, len, out->content_digest, sizeof out->content_digest) != 0)
        return VL_ETOOBIG;
    vcrypto_http_request rq = {.method = method,
                               .path_query = path_query,
                               .content_digest = has_body ? out->content_digest : NULL,
                               .content_length = has_body ? clen : NULL};
    /* What the lookup cannot hold it would not sign (see above). */
    if (strlen(path_query) + 2 > sizeof rq.scratch) return VL_ETOOBIG;
    vl_buf base;
    vl_buf_init(&base, 4 * VCRYPTO_SIG_HEADER_MAX + strlen(path_query) * 2);
    vl_error e = {0};
    int rc = vcrypto_sig_base(&s, vcrypto_http_request_lookup, &rq, &base, &e);
    uint8_t sig[VCRYPTO_SIG_BYTES];
    if (rc == VL_OK) crypto_sign_detached(sig, NULL, base.data, base.len, id->sk);
    vl_buf_free(&base);
    if (rc != VL_OK) return rc == VL_ETOOBIG ? VL_ETOOBIG : VL_EINVAL;
    char b64[VCRYPTO_SIG_B64_LEN + 1];
    vl_base64_encode(sig, sizeof sig, b64);
    int n1 = snprintf(out->signature_input, sizeof out->signature_input, VCRYPTO_SIG_LABEL "=%s",
                      s.params);
    int n2 = snprintf(out->signature, sizeof out->signature, VCRYPTO_SIG_LABEL "=:%s:", b64);
    if (n1 < 0 || (size_t)n1 >= sizeof out->signature_input || n2 < 0 ||
        (size_t)n2 >= sizeof out->signature)
        return VL_ETOOBIG;
    return VL_OK;
}
