/* The device GPT's passes in KERNELS_CUDA_BF16 mode: gpt_cuda.c's float32
 * passes, layer for layer, with the products on bfloat16 operands
 * (kernels/cuda_bf16.h). What stays float32: the residual stream, every
 * LayerNorm's input and statistics, the MLP's pre-activation (GELU's
 * backward reads it), the logits and probabilities, and every gradient
 * that is summed into. What is rounded: the parameters (once per forward,
 * from the float32 master copy, so nothing that writes the parameters
 * needs to know), and each product's activation operand, written as
 * bfloat16 by the kernel that produces it. */
#include <stddef.h>

#include "kernels/cuda_bf16.h"
#include "kernels/cuda_model.h"
#include "model/gpt_cuda_internal.h"
#include "model/gpt_internal.h"

int gpt_cuda_forward_bf16(model_gpt_cuda *g, int B, int T, vl_error *err) {
    const model_gpt_config *c = &g->cfg;
    gpt_acts *a = &g->acts;
    gpt_half *h = &g->half;
    kernels_cuda_ctx *ctx = g->ctx;
    int N = B * T, C = c->n_embd, L = c->n_layer, NH = c->n_head, V = c->vocab_size;
    float *P = g->params;

    /* The token embedding goes to its padded copy; the rest (from wpe,
     * which follows it in the table) to params_h. */
    size_t rest = g->tensors[GPT_WPE].offset;
    TRY(kernels_cuda_to_bf16(g->wte_h, tensor(g, P, GPT_WTE), (size_t)V * C, err));
    TRY(kernels_cuda_to_bf16(g->params_h + rest, P + rest, g->num_params - rest, err));
    TRY(kernels_cuda_encoder_forward(a->encoded, a->inputs, tensor(g, P, GPT_WTE),
                                     tensor(g, P, GPT_WPE), B, T, C, err));
    for (int l = 0; l < L; l++) {
        gpt_layer_acts *la = &a->layers[l];
        gpt_half_layer *hl = &h->layers[l];
        const float *x = l == 0 ? a->encoded : a->layers[l - 1].res3;
#define W(k) tensor(g, P, GPT_LAYER(l, k))
#define WH(k) tensor_h(g, GPT_LAYER(l, k))
        TRY(kernels_cuda_layernorm_forward_bf16(hl->ln1, la->ln1_mean, la->ln1_rstd, x,
                                                W(GPT_LN1_W), W(GPT_LN1_B), N, C, err));
        /* Biases are added by the kernel that next reads each product. */
        TRY(kernels_cuda_matmul_forward_bf16(ctx, la->qkv, hl->ln1, WH(GPT_QKV_W), NULL, N, C,
                                             3 * C, err));
        TRY(kernels_cuda_bias_to_bf16(hl->qkv, la->qkv, W(GPT_QKV_B), N, 3 * C, err));
        /* la->att holds the float32 scores; the probabilities go to hl->att. */
        TRY(kernels_cuda_attention_forward_bf16(ctx, hl->atty, la->att, hl->att, hl->qkv, B, T, C,
                                                NH, err));
        TRY(kernels_cuda_matmul_forward_bf16(ctx, a->proj, hl->atty, WH(GPT_ATTPROJ_W), NULL, N, C,
                                             C, err));
        TRY(kernels_cuda_residual_bias_forward(la->res2, x, a->proj, W(GPT_ATTPROJ_B), N, C, err));
        TRY(kernels_cuda_layernorm_forward_bf16(hl->ln2, la->ln2_mean, la->ln2_rstd, la->res2,
                                                W(GPT_LN2_W), W(GPT_LN2_B), N, C, err));
        TRY(kernels_cuda_matmul_forward_bf16(ctx, la->fch, hl->ln2, WH(GPT_FC_W), NULL, N, C, 4 * C,
                                             err));
        TRY(kernels_cuda_bias_gelu_forward_bf16(la->fch, hl->fchg, W(GPT_FC_B), N, 4 * C, err));
        TRY(kernels_cuda_matmul_forward_bf16(ctx, a->proj, hl->fchg, WH(GPT_FCPROJ_W), NULL, N,
                                             4 * C, C, err));
        TRY(kernels_cuda_residual_bias_forward(la->res3, la->res2, a->proj, W(GPT_FCPROJ_B), N, C,
                                               err));
#undef W
#undef WH
    }
    TRY(kernels_cuda_layernorm_forward_bf16(h->lnf, a->lnf_mean, a->lnf_rstd, a->layers[L - 1].res3,
                                            tensor(g, P, GPT_LNF_W(L)), tensor(g, P, GPT_LNF_B(L)),
                                            N, C, err));
    /* Over the padded vocabulary: the padding's logits come out zero and
     * are never read. */
    return kernels_cuda_matmul_wt_forward_bf16(ctx, a->logits, g->vld, h->lnf, g->wte_h, N, C,
                                               g->vld, err);
}

int gpt_cuda_backward_bf16(model_gpt_cuda *g, vl_error *err) {
    const model_gpt_config *c = &g->cfg;
    gpt_acts *a = &g->acts;
    gpt_grad_acts *gr = &g->gacts;
    gpt_half *h = &g->half;
    kernels_cuda_ctx *ctx = g->ctx;
    int B = g->B, T = g->T, N = B * T, C = c->n_embd, L = c->n_layer, NH = c->n_head,
        V = c->vocab_size;
    size_t NC = (size_t)N * C;
    float *P = g->params, *G = g->grads;

    TRY(kernels_cuda_softmax_xent_backward_bf16(h->dlogits, a->logits, a->targets, 1.0f / (float)N,
                                                N, V, g->vld, err));
    /* dres carries the residual stream's gradient down; LayerNorm's
     * backward adds into it. Every product's dinp is overwritten. */
    TRY(kernels_cuda_zero(gr->dres, NC * sizeof(float), err));
    /* dln over the padded width (dlogits is zero there); the embedding's
     * gradient over its V rows. */
    TRY(kernels_cuda_gemm_bf16(ctx, 0, 0, N, C, g->vld, 1.0f, h->dlogits, g->vld, g->wte_h, C, 0.0f,
                               gr->dln, C, err));
    TRY(kernels_cuda_matmul_wt_backward_bf16(ctx, NULL, tensor(g, G, GPT_WTE), h->dlogits, g->vld,
                                             h->lnf, NULL, N, C, V, err));
    TRY(kernels_cuda_layernorm_backward(
        gr->dres, tensor(g, G, GPT_LNF_W(L)), tensor(g, G, GPT_LNF_B(L)), gr->dln,
        a->layers[L - 1].res3, tensor(g, P, GPT_LNF_W(L)), a->lnf_mean, a->lnf_rstd, N, C, err));
    for (int l = L - 1; l >= 0; l--) {
        gpt_layer_acts *la = &a->layers[l];
        gpt_half_layer *hl = &h->layers[l];
        const float *x = l == 0 ? a->encoded : a->layers[l - 1].res3;
#define W(k) tensor(g, P, GPT_LAYER(l, k))
#define WH(k) tensor_h(g, GPT_LAYER(l, k))
#define D(k) tensor(g, G, GPT_LAYER(l, k))
        TRY(kernels_cuda_to_bf16(h->dout, gr->dres, NC, err));
        TRY(kernels_cuda_matmul_backward_bf16(ctx, gr->dfch_gelu, D(GPT_FCPROJ_W), D(GPT_FCPROJ_B),
                                              gr->dres, h->dout, hl->fchg, WH(GPT_FCPROJ_W), N,
                                              4 * C, C, err));
        TRY(kernels_cuda_gelu_backward_bf16(gr->dfch, h->dout, la->fch, gr->dfch_gelu, NC * 4,
                                            err));
        TRY(kernels_cuda_matmul_backward_bf16(ctx, gr->dln, D(GPT_FC_W), D(GPT_FC_B), gr->dfch,
                                              h->dout, hl->ln2, WH(GPT_FC_W), N, C, 4 * C, err));
        TRY(kernels_cuda_layernorm_backward(gr->dres, D(GPT_LN2_W), D(GPT_LN2_B), gr->dln, la->res2,
                                            W(GPT_LN2_W), la->ln2_mean, la->ln2_rstd, N, C, err));
        TRY(kernels_cuda_to_bf16(h->dout, gr->dres, NC, err));
        TRY(kernels_cuda_matmul_backward_bf16(ctx, gr->datty, D(GPT_ATTPROJ_W), D(GPT_ATTPROJ_B),
                                              gr->dres, h->dout, hl->atty, WH(GPT_ATTPROJ_W), N, C,
                                              C, err));
        TRY(kernels_cuda_to_bf16(h->dout, gr->datty, NC, err));
        /* gr->scratch (B*NH*T*T floats) takes the probabilities' gradient. */
        TRY(kernels_cuda_attention_backward_bf16(ctx, gr->dqkv, gr->scratch, h->ds, h->dout,
                                                 hl->qkv, hl->att, B, T, C, NH, err));
        TRY(kernels_cuda_to_bf16(h->dout, gr->dqkv, 3 * NC, err));
        TRY(kernels_cuda_matmul_backward_bf16(ctx, gr->dln, D(GPT_QKV_W), D(GPT_QKV_B), gr->dqkv,
                                              h->dout, hl->ln1, WH(GPT_QKV_W), N, C, 3 * C, err));
        TRY(kernels_cuda_layernorm_backward(gr->dres, D(GPT_LN1_W), D(GPT_LN1_B), gr->dln, x,
                                            W(GPT_LN1_W), la->ln1_mean, la->ln1_rstd, N, C, err));
#undef W
#undef WH
#undef D
    }
    return kernels_cuda_encoder_backward(tensor(g, G, GPT_WTE), tensor(g, G, GPT_WPE), gr->dres,
                                         a->inputs, B, T, C, err);
}
