/*
 * common: the pieces every other volley module stands on. Error reporting,
 * logging, growable byte buffers with hard caps, the safetensors codec that
 * carries every tensor on the wire and on disk, base64/hex, clocks, a small
 * deterministic RNG and float16 conversion. Nothing here does network or
 * database I/O, so peer and coordinator can both link it.
 *
 * Conventions: functions that can fail return 0 (VL_OK) or a negative VL_E*
 * code and, when given a vl_error, leave a one-line message in it.
 */
#ifndef VOLLEY_COMMON_H
#define VOLLEY_COMMON_H

#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#define VL_MUST_CHECK __attribute__((warn_unused_result))
/* The text of a macro's value, for messages built at compile time. */
#define VL_STR_(x) #x
#define VL_STR(x) VL_STR_(x)
#define VL_PRINTF(a, b) __attribute__((format(printf, a, b)))

/* ---- errors ------------------------------------------------------------ */

enum {
    VL_OK = 0,
    VL_ERR = -1,       /* generic failure */
    VL_ENOMEM = -2,    /* allocation failed */
    VL_EINVAL = -3,    /* malformed or out-of-range input */
    VL_EIO = -4,       /* file or network I/O failed */
    VL_ETOOBIG = -5,   /* input exceeds a configured cap */
    VL_ENOTFOUND = -6, /* named thing does not exist */
    VL_ECONFLICT = -7, /* state conflict: duplicate, stale, already done */
    VL_EAUTH = -8,     /* authentication failed */
    VL_EDB = -9,       /* database error */
    VL_ERANGE = -10,   /* value outside the allowed range (NaN, Inf, bound) */
    VL_EFULL = -11,    /* no room on the disk (or quota): the write may work later */
    VL_AGAIN = -12,    /* not now, and nothing failed: wait, or ask again later */
    VL_DONE = -13,     /* nothing more to do (a run that has finished) */
};

typedef struct vl_error {
    int code;
    char msg[256];
} vl_error;

/* Records code and a formatted message in err (which may be NULL) and
 * returns code, so callers can write `return vl_fail(err, VL_EINVAL, ...)`. */
int vl_fail(vl_error *err, int code, const char *fmt, ...) VL_PRINTF(3, 4);

/* Short static name of a VL_E* code ("invalid input", ...). */
const char *vl_strerror(int code);

/* ---- logging ----------------------------------------------------------- */

typedef enum { LOG_DEBUG = 0, LOG_INFO = 1, LOG_WARN = 2, LOG_ERROR = 3 } vl_log_level;

/* Lines go to stderr as "<iso time> <level> <program>: message". Thread
 * safe. Never pass secrets (tokens, keys) to the log. */
void vl_log_set_program(const char *name);
void vl_log_set_level(vl_log_level level);
void vl_log_msg(vl_log_level level, const char *fmt, ...) VL_PRINTF(2, 3);
#define vl_log_debug(...) vl_log_msg(LOG_DEBUG, __VA_ARGS__)
#define vl_log_info(...) vl_log_msg(LOG_INFO, __VA_ARGS__)
#define vl_log_warn(...) vl_log_msg(LOG_WARN, __VA_ARGS__)
#define vl_log_error(...) vl_log_msg(LOG_ERROR, __VA_ARGS__)

/* A writer takes over how lines reach stderr, for a program that keeps a
 * status line on a terminal or writes its lines in another format (the
 * peer: peer/ui.h). It is called under the log's lock for every line
 * that passes the level, with the line's time, level, program name and
 * message (no trailing newline), and writes to stderr itself (vl_log_write);
 * it must not log. NULL restores the built-in lines. */
struct timespec;
typedef void (*vl_log_writer)(void *arg, const struct timespec *ts, vl_log_level level,
                              const char *program, const char *msg);
void vl_log_set_writer(vl_log_writer fn, void *arg);
/* Runs fn(arg) under the log's lock, so that what it writes to stderr
 * never lands inside a log line. fn must not log. */
void vl_log_locked(void (*fn)(void *arg), void *arg);
/* Writes all n bytes to stderr, retrying short writes; for writers. */
void vl_log_write(const char *p, size_t n);
/* The built-in line "<iso time> <LEVEL> <program>: msg\n" into out (cap
 * >= 8): cut to fit, the cut marked "...", always one line ending in a
 * newline. Returns its length. */
size_t vl_log_format(char *out, size_t cap, const struct timespec *ts, vl_log_level level,
                     const char *program, const char *msg);
/* "DEBUG", "INFO", "WARN" or "ERROR". */
const char *vl_log_level_name(vl_log_level level);

/* ---- growable buffers -------------------------------------------------- */

/* A byte buffer that grows geometrically up to cap bytes; an append that
 * would pass the cap fails with VL_ETOOBIG and leaves the buffer unchanged.
 * data is always NUL-terminated one byte past len, so text is usable as a C
 * string. The buffer owns data; vl_buf_free releases it. */
typedef struct vl_buf {
    uint8_t *data;
    size_t len;
    size_t alloc;
    size_t cap;
} vl_buf;

#define VL_BUF_DEFAULT_CAP ((size_t)1 << 30)

void vl_buf_init(vl_buf *b, size_t cap);
void vl_buf_free(vl_buf *b);
void vl_buf_reset(vl_buf *b); /* len = 0, memory kept */
int vl_buf_reserve(vl_buf *b, size_t extra) VL_MUST_CHECK;
int vl_buf_append(vl_buf *b, const void *p, size_t n) VL_MUST_CHECK;
int vl_buf_append_str(vl_buf *b, const char *s) VL_MUST_CHECK;
int vl_buf_printf(vl_buf *b, const char *fmt, ...) VL_PRINTF(2, 3) VL_MUST_CHECK;
/* Hands the bytes to the caller (free() them); the buffer becomes empty. */
uint8_t *vl_buf_steal(vl_buf *b, size_t *len);

/* Reads a whole file into b (respecting its cap). */
int vl_buf_read_file(vl_buf *b, const char *path, vl_error *err) VL_MUST_CHECK;
/* Writes data to path atomically (temp file, fsync, rename) with the given
 * mode, e.g. 0600 for keys. */
int vl_file_write_atomic(const char *path, const void *data, size_t len, unsigned mode,
                         vl_error *err) VL_MUST_CHECK;
/* fsyncs the directory dir, so that entries created, renamed or removed
 * in it survive a power cut. */
int vl_file_sync_dir(const char *dir, vl_error *err) VL_MUST_CHECK;

/* ---- safetensors ------------------------------------------------------- */

/* The safetensors format: u64 little-endian header length N, N bytes of JSON
 * header {"name": {"dtype", "shape", "data_offsets": [b, e]}, ...,
 * "__metadata__": {str: str}}, then the data block. The parser trusts
 * nothing: lengths, offsets, shapes and overlaps are all checked. */

typedef enum {
    ST_F32 = 0,
    ST_F16 = 1,
    ST_BF16 = 2,
    ST_U32 = 3,
    ST_I32 = 4,
    ST_U16 = 5,
    ST_U8 = 6,
    ST_I64 = 7,
    ST_F64 = 8
} st_dtype;

#define ST_MAX_DIMS 8
#define ST_MAX_HEADER ((size_t)1 << 20) /* refuse JSON headers over 1 MiB */
#define ST_MAX_TENSORS 4096
#define ST_MAX_META 64

/* Size in bytes of one element of dtype. */
size_t st_dtype_size(st_dtype dt);
const char *st_dtype_name(st_dtype dt);
/* Parses "F32", "F16", ...; returns 0 or VL_EINVAL. */
int st_dtype_parse(const char *name, st_dtype *out) VL_MUST_CHECK;

typedef struct st_tensor {
    char name[128];
    st_dtype dtype;
    int ndim;
    uint64_t shape[ST_MAX_DIMS];
    uint64_t numel;
    const uint8_t *data; /* points into the parsed file; not owned */
    size_t nbytes;
} st_tensor;

typedef struct st_meta {
    char key[64];
    char value[256];
} st_meta;

/* A parsed file. Tensor data points into the caller's bytes, which must
 * outlive the st_file. st_free releases the tables only. */
typedef struct st_file {
    st_tensor *tensors;
    int ntensors;
    st_meta meta[ST_MAX_META];
    int nmeta;
} st_file;

/* Parses and validates len bytes. Rejects: truncated input, a header length
 * over ST_MAX_HEADER or past the end, malformed JSON, unknown dtypes, shapes
 * whose byte size does not match data_offsets, offsets out of range,
 * overlapping tensors, gaps or trailing bytes, duplicate names, data not
 * aligned to its element size, and more than ST_MAX_TENSORS tensors. */
int st_parse(const uint8_t *bytes, size_t len, st_file *out, vl_error *err) VL_MUST_CHECK;
void st_free(st_file *f);
/* Named tensor or NULL. */
const st_tensor *st_find(const st_file *f, const char *name);
/* Metadata value or NULL. */
const char *st_meta_get(const st_file *f, const char *key);

/* Builds a file: add metadata and tensors (their bytes are copied when
 * st_writer_finish serialises), then finish into out. */
typedef struct st_writer {
    struct st_wtensor {
        char name[128];
        st_dtype dtype;
        int ndim;
        uint64_t shape[ST_MAX_DIMS];
        const void *data;
        size_t nbytes;
    } * tensors;
    int ntensors, alloc;
    st_meta meta[ST_MAX_META];
    int nmeta;
} st_writer;

void st_writer_init(st_writer *w);
void st_writer_free(st_writer *w);
int st_writer_meta(st_writer *w, const char *key, const char *value) VL_MUST_CHECK;
/* data must stay valid until st_writer_finish returns. */
int st_writer_add(st_writer *w, const char *name, st_dtype dt, int ndim, const uint64_t *shape,
                  const void *data, size_t nbytes) VL_MUST_CHECK;
/* Serialises into out (appending); the header is padded with spaces so the
 * data block starts 8-byte aligned. */
int st_writer_finish(st_writer *w, vl_buf *out, vl_error *err) VL_MUST_CHECK;

/* Converts a tensor of dtype F32 or F16 to n floats in dst (n must equal
 * numel); anything else is VL_EINVAL. */
int st_tensor_to_f32(const st_tensor *t, float *dst, size_t n, vl_error *err) VL_MUST_CHECK;

/* ---- float16 ----------------------------------------------------------- */

uint16_t vl_f32_to_f16(float f); /* round to nearest even, overflow to Inf */
float vl_f16_to_f32(uint16_t h);

/* ---- encodings --------------------------------------------------------- */

/* Standard base64 with padding (RFC 4648 section 4), constant-time
 * (libsodium). out must hold vl_base64_encoded_len(n) bytes (NUL included).
 * decode reads exactly n bytes and returns the decoded length, or -1 on
 * bad input (whitespace, wrong padding, non-zero trailing bits) or when it
 * would exceed out_cap. */
size_t vl_base64_encoded_len(size_t n);
void vl_base64_encode(const uint8_t *in, size_t n, char *out);
long vl_base64_decode(const char *in, size_t n, uint8_t *out, size_t out_cap);

/* Hex, constant-time (libsodium); encode writes lowercase and out must hold
 * 2n+1 bytes. decode needs exactly 2*out_len hex digits of either case and
 * returns 0 or -1. */
void vl_hex_encode(const uint8_t *in, size_t n, char *out);
int vl_hex_decode(const char *in, size_t in_len, uint8_t *out, size_t out_len) VL_MUST_CHECK;

/* ---- clocks and randomness ---------------------------------------------- */

int64_t vl_clock_unix_s(void); /* wall clock, seconds */
double vl_clock_mono_s(void);  /* monotonic, seconds */
void vl_clock_sleep_ms(long ms);

/* vl_splitmix64 as specified in DESIGN.md; also the seed mixer for the RNG. */
uint64_t vl_splitmix64(uint64_t x);

/* xoshiro256** seeded through vl_splitmix64: deterministic for a given seed on
 * every platform. */
typedef struct vl_rng {
    uint64_t s[4];
} vl_rng;
void vl_rng_seed(vl_rng *r, uint64_t seed);
uint64_t vl_rng_u64(vl_rng *r);
uint32_t vl_rng_below(vl_rng *r, uint32_t n); /* uniform in [0, n), n > 0 */
/* Uniform in [0, n) for any 64-bit n > 0: vl_rng_below below 2^32, so small
 * ranges draw as before, and rejection above it, so large ranges are not
 * biased towards small values. */
uint64_t vl_rng_below_u64(vl_rng *r, uint64_t n);
float vl_rng_uniform(vl_rng *r); /* [0, 1) */
float vl_rng_normal(vl_rng *r);  /* standard normal */
/* Advances r exactly as n vl_rng_normal calls would, without computing them,
 * so a long run of draws can be split into chunks computed apart (each
 * from the state at its start) with the very same results. */
void vl_rng_normal_skip(vl_rng *r, uint64_t n);
/* Uniform in (0, 1) with 53 bits, never 0 or 1, so its log is finite
 * (vl_rng_uniform's float has 24 bits and can be exactly 0). */
double vl_rng_uniform_open(vl_rng *r);
/* The log of one Gamma(shape, 1) draw, shape > 0 and finite (not
 * checked): Marsaglia and Tsang (2000), with shape < 1 drawn as
 * Gamma(shape + 1) * U^(1/shape). In logarithms because that boost
 * underflows a double for small shapes (0.1 and below) often enough to
 * leave a Dirichlet draw all zero. Dirichlet proportions are these draws
 * exponentiated relative to their largest and normalised. */
double vl_rng_log_gamma(vl_rng *r, double shape);

/* ---- small helpers ----------------------------------------------------- */

/* Parses a base-10 integer that must fill the whole string and lie in
 * [min, max]; returns 0 or VL_EINVAL. */
int vl_parse_i64(const char *s, int64_t min, int64_t max, int64_t *out) VL_MUST_CHECK;
/* Same for a finite double. */
int vl_parse_f64(const char *s, double *out) VL_MUST_CHECK;

#endif
