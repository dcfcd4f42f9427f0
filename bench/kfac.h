/* The two parts of bench_kfac: the MLP (kfac.c) and the GPT (kfac_gpt.c).
 * Each prints its tables and returns 0, or 1 after printing why to
 * stderr. */
#ifndef VOLLEY_BENCH_KFAC_H
#define VOLLEY_BENCH_KFAC_H

/* K-FAC against AdamW on the default byte GPT; quick runs a reduced sweep. */
int bench_kfac_gpt(int quick);

#endif
