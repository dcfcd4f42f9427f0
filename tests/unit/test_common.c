/* Unit tests for common: errors, logging, buffers, file I/O, float16,
 * encodings, clocks, RNG and number parsing. */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdint.h>
#include <cmocka.h>

#include <dirent.h>
#include <fcntl.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "common/common.h"

/* ---- errors and logging ------------------------------------------------ */

static void test_vl_fail(void **state) {
    (void)state;
    vl_error e = {0};
    assert_int_equal(vl_fail(&e, VL_EINVAL, "bad %s %d", "thing", 7), VL_EINVAL);
    assert_int_equal(e.code, VL_EINVAL);
    assert_string_equal(e.msg, "bad thing 7");
    assert_int_equal(vl_fail(NULL, VL_EIO, "ignored"), VL_EIO);

    /* Messages longer than the field are truncated, never overflowed. */
    char big[600];
    memset(big, 'x', sizeof big - 1);
    big[sizeof big - 1] = '\0';
    vl_fail(&e, VL_ERR, "%s", big);
    assert_int_equal(strlen(e.msg), sizeof e.msg - 1);

    assert_string_equal(vl_strerror(VL_OK), "ok");
    assert_string_equal(vl_strerror(VL_EINVAL), "invalid input");
    assert_string_equal(vl_strerror(VL_ENOMEM), "out of memory");
    assert_non_null(vl_strerror(-1000));
    for (int c = VL_ERANGE; c <= VL_OK; c++) assert_true(strlen(vl_strerror(c)) > 0);
}

/* Captures what vl_log_msg writes to stderr into out. */
static void capture_log(void (*fn)(void), char *out, size_t cap) {
    char path[] = "/tmp/volley-log-XXXXXX";
    int fd = mkstemp(path);
    assert_true(fd >= 0);
    fflush(stderr);
    int saved = dup(STDERR_FILENO);
    assert_true(saved >= 0);
    assert_true(dup2(fd, STDERR_FILENO) >= 0);
    fn();
    assert_true(dup2(saved, STDERR_FILENO) >= 0);
    close(saved);
    ssize_t n = pread(fd, out, cap - 1, 0);
    assert_true(n >= 0);
    out[n] = '\0';
    close(fd);
    unlink(path);
}

static void log_some(void) {
    vl_log_set_program("tester");
    vl_log_set_level(LOG_WARN);
    vl_log_info("hidden %d", 1);
    vl_log_warn("shown %d", 2);
    vl_log_error("also shown\n");
    vl_log_set_level(LOG_INFO);
}

static void log_long(void) {
    char big[10000];
    memset(big, 'y', sizeof big - 1);
    big[sizeof big - 1] = '\0';
    vl_log_error("%s", big);
}

static int looks_like_iso_time(const char *p) {
    /* 2024-01-02T03:04:05.678Z */
    const char *pat = "dddd-dd-ddTdd:dd:dd.dddZ ";
    for (size_t i = 0; pat[i]; i++) {
        if (pat[i] == 'd' ? (p[i] < '0' || p[i] > '9') : p[i] != pat[i]) return 0;
    }
    return 1;
}

static void test_log_format(void **state) {
    (void)state;
    unsetenv("VOLLEY_LOG"); /* read once, on the first log call */
    char out[16384];
    capture_log(log_some, out, sizeof out);
    char *nl = strchr(out, '\n');
    assert_non_null(nl);
    assert_true(looks_like_iso_time(out));
    assert_memory_equal(out + 25, "WARN tester: shown 2\n", 21);
    char *second = nl + 1;
    assert_true(looks_like_iso_time(second));
    assert_string_equal(second + 25, "ERROR tester: also shown\n");
    assert_null(strstr(out, "hidden"));

    capture_log(log_long, out, sizeof out);
    size_t n = strlen(out);
    assert_true(n > 1000 && n <= 4096);
    assert_int_equal(out[n - 1], '\n');
    assert_memory_equal(out + n - 4, "...", 3);
    assert_true(strchr(out, '\n') == out + n - 1); /* still exactly one line */
}

/* ---- buffers ----------------------------------------------------------- */

static void test_buf_cap(void **state) {
    (void)state;
    vl_buf b;
    vl_buf_init(&b, 10);
    assert_int_equal(vl_buf_append(&b, "abcdefgh", 8), VL_OK);
    assert_int_equal(vl_buf_append(&b, "123", 3), VL_ETOOBIG);
    assert_int_equal(b.len, 8);
    assert_string_equal((char *)b.data, "abcdefgh");
    assert_int_equal(vl_buf_printf(&b, "%s", "xyz"), VL_ETOOBIG);
    assert_int_equal(b.len, 8);
    assert_string_equal((char *)b.data, "abcdefgh");
    assert_int_equal(vl_buf_append_str(&b, "12"), VL_OK);
    assert_int_equal(b.len, 10);
    assert_string_equal((char *)b.data, "abcdefgh12");
    assert_int_equal(vl_buf_append(&b, "z", 1), VL_ETOOBIG);
    assert_int_equal(vl_buf_reserve(&b, 1), VL_ETOOBIG);
    assert_int_equal(vl_buf_reserve(&b, SIZE_MAX), VL_ETOOBIG);
    assert_int_equal(vl_buf_append(&b, "", 0), VL_OK);
    assert_int_equal(b.len, 10);
    assert_true(b.alloc <= 11);
    vl_buf_reset(&b);
    assert_int_equal(b.len, 0);
    assert_string_equal((char *)b.data, "");
    assert_int_equal(vl_buf_printf(&b, "%d", 1234567890), VL_OK);
    assert_int_equal(vl_buf_printf(&b, "%d", 1), VL_ETOOBIG);
    assert_string_equal((char *)b.data, "1234567890");
    vl_buf_free(&b);
    assert_null(b.data);

    vl_buf_init(&b, 0); /* zero means the default cap */
    assert_int_equal(b.cap, VL_BUF_DEFAULT_CAP);
    assert_int_equal(vl_buf_append(&b, NULL, 0), VL_OK);
    assert_non_null(b.data); /* any successful append leaves a C string */
    assert_string_equal((char *)b.data, "");
    vl_buf_free(&b);
}

static void test_buf_printf_growth(void **state) {
    (void)state;
    vl_buf b;
    vl_buf_init(&b, 1 << 20);
    char *expect = malloc(200000);
    assert_non_null(expect);
    size_t el = 0;
    for (int i = 0; i < 10000; i++) {
        assert_int_equal(vl_buf_printf(&b, "%d,", i * 7), VL_OK);
        el += (size_t)snprintf(expect + el, 200000 - el, "%d,", i * 7);
    }
    assert_int_equal(b.len, el);
    assert_memory_equal(b.data, expect, el);
    assert_int_equal(b.data[b.len], '\0');

    /* A single format result much larger than the current allocation. */
    memset(expect, 'q', 50000);
    expect[50000] = '\0';
    vl_buf_reset(&b);
    assert_int_equal(vl_buf_printf(&b, "<%s>", expect), VL_OK);
    assert_int_equal(b.len, 50002);
    assert_int_equal(b.data[0], '<');
    assert_int_equal(b.data[50001], '>');
    assert_int_equal(b.data[50002], '\0');
    free(expect);
    vl_buf_free(&b);
}

static void test_buf_steal(void **state) {
    (void)state;
    vl_buf b;
    vl_buf_init(&b, 100);
    assert_int_equal(vl_buf_append_str(&b, "hello"), VL_OK);
    size_t n = 99;
    uint8_t *p = vl_buf_steal(&b, &n);
    assert_non_null(p);
    assert_int_equal(n, 5);
    assert_string_equal((char *)p, "hello");
    free(p);
    assert_null(b.data);
    assert_int_equal(b.len, 0);
    assert_int_equal(b.cap, 100);
    assert_int_equal(vl_buf_append_str(&b, "again"), VL_OK);
    assert_string_equal((char *)b.data, "again");
    vl_buf_free(&b);

    vl_buf_init(&b, 100);
    p = vl_buf_steal(&b, &n);
    assert_non_null(p);
    assert_int_equal(n, 0);
    assert_string_equal((char *)p, "");
    free(p);
    vl_buf_free(&b);
}

static char tmpdir[64];

static int setup_tmpdir(void **state) {
    (void)state;
    snprintf(tmpdir, sizeof tmpdir, "/tmp/volley-test-XXXXXX");
    return mkdtemp(tmpdir) ? 0 : -1;
}

static int teardown_tmpdir(void **state) {
    (void)state;
    DIR *d = opendir(tmpdir);
    if (d) {
        struct dirent *e;
        char p[512];
        while ((e = readdir(d))) {
            if (!strcmp(e->d_name, ".") || !strcmp(e->d_name, "..")) continue;
            snprintf(p, sizeof p, "%s/%s", tmpdir, e->d_name);
            unlink(p);
        }
        closedir(d);
    }
    rmdir(tmpdir);
    return 0;
}

static int count_entries(const char *dir) {
    DIR *d = opendir(dir);
    assert_non_null(d);
    int n = 0;
    struct dirent *e;
    while ((e = readdir(d)))
        if (strcmp(e->d_name, ".") && strcmp(e->d_name, "..")) n++;
    closedir(d);
    return n;
}

static void test_file_write_atomic(void **state) {
    (void)state;
    char path[256];
    snprintf(path, sizeof path, "%s/key", tmpdir);
    vl_error e = {0};
    mode_t old = umask(022);
    assert_int_equal(vl_file_write_atomic(path, "secret", 6, 0600, &e), VL_OK);
    struct stat st;
    assert_int_equal(stat(path, &st), 0);
    assert_int_equal(st.st_mode & 0777, 0600);
    assert_int_equal(st.st_size, 6);

    /* Replacing keeps exactly one file and takes the new mode, whatever the
     * umask says. */
    umask(077);
    assert_int_equal(vl_file_write_atomic(path, "longer content", 14, 0644, &e), VL_OK);
    umask(old);
    assert_int_equal(stat(path, &st), 0);
    assert_int_equal(st.st_mode & 0777, 0644);
    assert_int_equal(count_entries(tmpdir), 1);

    vl_buf b;
    vl_buf_init(&b, 1024);
    assert_int_equal(vl_buf_read_file(&b, path, &e), VL_OK);
    assert_int_equal(b.len, 14);
    assert_string_equal((char *)b.data, "longer content");
    vl_buf_free(&b);

    /* Empty file. */
    assert_int_equal(vl_file_write_atomic(path, "", 0, 0600, &e), VL_OK);
    vl_buf_init(&b, 16);
    assert_int_equal(vl_buf_read_file(&b, path, &e), VL_OK);
    assert_int_equal(b.len, 0);
    assert_non_null(b.data);
    vl_buf_free(&b);

    /* A missing directory fails cleanly. */
    char bad[300];
    snprintf(bad, sizeof bad, "%s/nope/key", tmpdir);
    e.msg[0] = '\0';
    assert_int_equal(vl_file_write_atomic(bad, "x", 1, 0600, &e), VL_EIO);
    assert_true(strlen(e.msg) > 0);
    assert_int_equal(count_entries(tmpdir), 1);
}

static void test_buf_read_file(void **state) {
    (void)state;
    char path[256];
    snprintf(path, sizeof path, "%s/data", tmpdir);
    vl_error e = {0};
    size_t n = 300000;
    uint8_t *data = malloc(n);
    assert_non_null(data);
    for (size_t i = 0; i < n; i++) data[i] = (uint8_t)(i * 31 + 7);
    assert_int_equal(vl_file_write_atomic(path, data, n, 0600, &e), VL_OK);

    vl_buf b;
    vl_buf_init(&b, n);
    assert_int_equal(vl_buf_read_file(&b, path, &e), VL_OK);
    assert_int_equal(b.len, n);
    assert_memory_equal(b.data, data, n);
    vl_buf_free(&b);

    /* Reading appends after existing content, and the cap covers both. */
    vl_buf_init(&b, n + 2);
    assert_int_equal(vl_buf_append(&b, "ab", 2), VL_OK);
    assert_int_equal(vl_buf_read_file(&b, path, &e), VL_OK);
    assert_int_equal(b.len, n + 2);
    assert_memory_equal(b.data + 2, data, n);
    vl_buf_free(&b);

    vl_buf_init(&b, n - 1);
    assert_int_equal(vl_buf_append(&b, "ab", 2), VL_OK);
    assert_int_equal(vl_buf_read_file(&b, path, &e), VL_ETOOBIG);
    assert_int_equal(b.len, 2);
    assert_string_equal((char *)b.data, "ab");
    vl_buf_free(&b);

    char missing[300];
    snprintf(missing, sizeof missing, "%s/missing", tmpdir);
    vl_buf_init(&b, 10);
    assert_int_equal(vl_buf_read_file(&b, missing, &e), VL_ENOTFOUND);
    assert_int_equal(b.len, 0);
    vl_buf_free(&b);

    /* Files whose size is not known up front are read to EOF, within cap. */
    vl_buf_init(&b, 1 << 20);
    assert_int_equal(vl_buf_read_file(&b, "/proc/self/status", &e), VL_OK);
    assert_true(b.len > 0);
    assert_non_null(strstr((char *)b.data, "Name:"));
    vl_buf_free(&b);
    vl_buf_init(&b, 8);
    assert_int_equal(vl_buf_read_file(&b, "/proc/self/status", &e), VL_ETOOBIG);
    assert_int_equal(b.len, 0);
    vl_buf_free(&b);

    unlink(path);
    free(data);
}

/* ---- float16 ----------------------------------------------------------- */

static float bits_f32(uint32_t x) {
    float f;
    memcpy(&f, &x, 4);
    return f;
}

static uint32_t f32_bits(float f) {
    uint32_t x;
    memcpy(&x, &f, 4);
    return x;
}

static int half_is_nan(uint16_t h) {
    return (h & 0x7c00) == 0x7c00 && (h & 0x3ff) != 0;
}

static void test_f16_known(void **state) {
    (void)state;
    struct {
        float f;
        uint16_t h;
    } known[] = {
        {0.0f, 0x0000},           {-0.0f, 0x8000},
        {1.0f, 0x3c00},           {-2.0f, 0xc000},
        {0.5f, 0x3800},           {65504.0f, 0x7bff},
        {65519.99f, 0x7bff},      {65520.0f, 0x7c00},
        {1e6f, 0x7c00},           {-1e6f, 0xfc00},
        {0.1f, 0x2e66},           {0.333333343f, 0x3555},
        {0x1p-14f, 0x0400},       {0x1p-24f, 0x0001},
        {0x1p-25f, 0x0000},       {0x1.000002p-25f, 0x0001},
        {0x1.8p-24f, 0x0002},     {0x1.4p-23f, 0x0002},
        {0x1.ff8p-15f, 0x03ff},   {0x1.ffcp-15f, 0x0400},
        {3.14159265f, 0x4248},    {-65504.0f, 0xfbff},
        {1.0009765625f, 0x3c01},  {1.00048828125f, 0x3c00},
        {1.00146484375f, 0x3c02}, {0x1p-30f, 0x0000},
        {-0x1p-30f, 0x8000},
    };
    for (size_t i = 0; i < sizeof known / sizeof known[0]; i++) {
        uint16_t got = vl_f32_to_f16(known[i].f);
        if (got != known[i].h)
            fail_msg("vl_f32_to_f16(%a) = 0x%04x, want 0x%04x", (double)known[i].f, got,
                     known[i].h);
    }
    assert_int_equal(vl_f32_to_f16(INFINITY), 0x7c00);
    assert_int_equal(vl_f32_to_f16(-INFINITY), 0xfc00);
    assert_true(half_is_nan(vl_f32_to_f16(NAN)));
    assert_true(half_is_nan(vl_f32_to_f16(bits_f32(0x7f800001)))); /* payload only in low bits */
    assert_true(half_is_nan(vl_f32_to_f16(bits_f32(0xffc00000))));
    assert_true(isnan(vl_f16_to_f32(0x7e00)));
    assert_true(isinf(vl_f16_to_f32(0x7c00)));
    assert_true(vl_f16_to_f32(0x0001) == 0x1p-24f);
    assert_true(vl_f16_to_f32(0x03ff) == 0x1.ff8p-15f);
    assert_true(vl_f16_to_f32(0x7bff) == 65504.0f);
    assert_true(vl_f16_to_f32(0x3c00) == 1.0f);
    assert_int_equal(f32_bits(vl_f16_to_f32(0x8000)), 0x80000000u);
}

/* Every half: exact widening, identity round trip, and correct rounding of
 * the exact midpoint to its neighbour and of the floats just beside it. */
static void test_f16_exhaustive(void **state) {
    (void)state;
    for (uint32_t h = 0; h < 65536; h++) {
        float f = vl_f16_to_f32((uint16_t)h);
        if (half_is_nan((uint16_t)h)) {
            assert_true(isnan(f));
            assert_true(half_is_nan(vl_f32_to_f16(f)));
            continue;
        }
        if (vl_f32_to_f16(f) != h)
            fail_msg("round trip of 0x%04x gave 0x%04x", h, vl_f32_to_f16(f));
        uint32_t mag = h & 0x7fff;
        if (mag >= 0x7c00) continue;
        /* Magnitude of the next half up: the midpoint is exact in float. */
        float lo = fabsf(f), hi = fabsf(vl_f16_to_f32((uint16_t)(mag + 1)));
        float mid = (float)(((double)lo + (double)hi) / 2);
        if (mag == 0x7bff) hi = 65536.0f, mid = 65520.0f;
        uint16_t even = (mag & 1) ? (uint16_t)(mag + 1) : (uint16_t)mag;
        uint16_t sign = (uint16_t)(h & 0x8000);
        float s = sign ? -1.0f : 1.0f;
        uint16_t got_mid = vl_f32_to_f16(s * mid);
        uint16_t got_below = vl_f32_to_f16(s * nextafterf(mid, 0.0f));
        uint16_t got_above = vl_f32_to_f16(s * nextafterf(mid, INFINITY));
        if (got_mid != (sign | even) || got_below != (sign | mag) ||
            got_above != (sign | (mag + 1)))
            fail_msg("rounding near 0x%04x: mid 0x%04x below 0x%04x above 0x%04x", h, got_mid,
                     got_below, got_above);
    }
}

#if defined(__FLT16_MAX__) && defined(__x86_64__)
/* The compiler's own conversion (F16C or soft-float) as a second opinion
 * over a wide sweep of float bit patterns. */
static void test_f16_vs_compiler(void **state) {
    (void)state;
    for (uint64_t x = 0; x <= 0xffffffffu; x += 251) {
        float f = bits_f32((uint32_t)x);
        if (isnan(f)) continue;
        _Float16 c = (_Float16)f;
        uint16_t ref;
        memcpy(&ref, &c, 2);
        uint16_t got = vl_f32_to_f16(f);
        if (got != ref)
            fail_msg("vl_f32_to_f16(0x%08x) = 0x%04x, compiler says 0x%04x", (unsigned)x, got, ref);
    }
}
#endif

/* ---- encodings --------------------------------------------------------- */

static void test_base64_vectors(void **state) {
    (void)state;
    const char *plain[] = {"", "f", "fo", "foo", "foob", "fooba", "foobar"};
    const char *enc[] = {"", "Zg==", "Zm8=", "Zm9v", "Zm9vYg==", "Zm9vYmE=", "Zm9vYmFy"};
    for (int i = 0; i < 7; i++) {
        size_t n = strlen(plain[i]);
        char out[32];
        assert_int_equal(vl_base64_encoded_len(n), strlen(enc[i]) + 1);
        vl_base64_encode((const uint8_t *)plain[i], n, out);
        assert_string_equal(out, enc[i]);
        uint8_t dec[32];
        assert_int_equal(vl_base64_decode(enc[i], strlen(enc[i]), dec, sizeof dec), (long)n);
        assert_memory_equal(dec, plain[i], n);
    }
}

static void test_base64_roundtrip(void **state) {
    (void)state;
    vl_rng r;
    vl_rng_seed(&r, 99);
    uint8_t in[300], dec[300];
    char out[512];
    for (size_t n = 0; n < 300; n++) {
        for (size_t i = 0; i < n; i++) in[i] = (uint8_t)vl_rng_u64(&r);
        vl_base64_encode(in, n, out);
        assert_int_equal(strlen(out) + 1, vl_base64_encoded_len(n));
        assert_int_equal(vl_base64_decode(out, strlen(out), dec, n), (long)n);
        assert_memory_equal(dec, in, n);
        if (n > 0) /* one byte short of room */
            assert_int_equal(vl_base64_decode(out, strlen(out), dec, n - 1), -1);
    }
}

static void test_base64_reject(void **state) {
    (void)state;
    const char *bad[] = {
        "Zg=", "Zg=a", "Z===", "====", "Zh==", "Zm9=", "Zm9v!A==", "=Zm9", "Zm=v",
        "Zm9v Zg==", "Zm9vYg==Zm9v", "Zg==Zg==", "Zm9", "Zm9vY", "Zm9vYmF-", "Zm9vYmF_", "\nZm9",
        /* what a lenient decoder would skip or mend */
        "Zm9v\r\nYmFy", "Zm9v\tYmFy", "Zm9vYmFy ", "Zm9vYmFy\n",
        "Zm9vYg= =", "Zm9vYg=\n=", "Zm9vYg==\n", "Zm9vYg===", "Zm9vYmE==", "Zm9vYmE", "Zm9vYg",
        "Zm9vYg=", "Zm9v=", "Zm9vYmFy="};
    uint8_t out[64];
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        if (vl_base64_decode(bad[i], strlen(bad[i]), out, sizeof out) != -1)
            fail_msg("accepted bad base64 '%s'", bad[i]);
    }
    /* All 256 byte values in each place of a group: only the alphabet's
     * 64 pass. After "Z" a one-byte group must end in a digit whose low
     * four bits are zero. */
    const char *alphabet = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    for (int c = 0; c < 256; c++) {
        const char *at = c ? strchr(alphabet, c) : NULL;
        for (int pos = 0; pos < 4; pos++) {
            char in[4] = {'Z', 'm', '9', 'v'};
            in[pos] = (char)c;
            if (vl_base64_decode(in, 4, out, sizeof out) != (at ? 3 : -1))
                fail_msg("byte 0x%02x at %d: wrong verdict", (unsigned)c, pos);
        }
        char one[4] = {'Z', (char)c, '=', '='};
        assert_int_equal(vl_base64_decode(one, 4, out, sizeof out),
                         at && (at - alphabet) % 16 == 0 ? 1 : -1);
    }
    /* Length is taken from n, not from a NUL: a NUL inside is just bad input. */
    assert_int_equal(vl_base64_decode("Zm\0v", 4, out, sizeof out), -1);
    assert_int_equal(vl_base64_decode("Zm9vYmFy", 8, out, 6), 6);
    assert_int_equal(vl_base64_decode("Zm9vYmFy", 8, out, 5), -1);
    assert_int_equal(vl_base64_decode("Zm9vYmE=", 8, out, 5), 5);
    assert_int_equal(vl_base64_decode("Zm9vYmFyXXXX", 8, out, 6), 6); /* n bounds the read */
    assert_int_equal(vl_base64_decode("", 0, NULL, 0), 0);
}

static void test_hex(void **state) {
    (void)state;
    uint8_t in[256], dec[256];
    char out[513];
    for (int i = 0; i < 256; i++) in[i] = (uint8_t)i;
    vl_hex_encode(in, 256, out);
    assert_int_equal(strlen(out), 512);
    assert_memory_equal(out, "000102", 6);
    assert_string_equal(out + 500, "fafbfcfdfeff");
    assert_int_equal(vl_hex_decode(out, 512, dec, 256), 0);
    assert_memory_equal(dec, in, 256);

    vl_hex_encode(in, 0, out);
    assert_string_equal(out, "");
    assert_int_equal(vl_hex_decode("", 0, dec, 0), 0);
    assert_int_equal(vl_hex_decode("", 0, NULL, 0), 0);

    assert_int_equal(vl_hex_decode("0aFF", 4, dec, 2), 0);
    assert_int_equal(dec[0], 0x0a);
    assert_int_equal(dec[1], 0xff);
    assert_int_equal(vl_hex_decode("0g", 2, dec, 1), -1);
    assert_int_equal(vl_hex_decode(" a", 2, dec, 1), -1);
    assert_int_equal(vl_hex_decode("abc", 3, dec, 1), -1);
    assert_int_equal(vl_hex_decode("abcd", 4, dec, 1), -1);
    assert_int_equal(vl_hex_decode("ab", 2, dec, 2), -1);
    assert_int_equal(vl_hex_decode("ab", 2, dec, SIZE_MAX), -1);
    assert_int_equal(vl_hex_decode("ab:cd", 5, dec, 2), -1);
    assert_int_equal(vl_hex_decode("abcdef", 4, dec, 2), 0); /* in_len bounds the read */
    assert_int_equal(dec[1], 0xcd);
    /* All 256 byte values in either nibble: only the 22 hex digits pass. */
    for (int c = 0; c < 256; c++) {
        int digit = c != 0 && strchr("0123456789abcdefABCDEF", c) != NULL;
        char lo[2] = {'a', (char)c}, hi[2] = {(char)c, 'a'};
        assert_int_equal(vl_hex_decode(lo, 2, dec, 1), digit ? 0 : -1);
        assert_int_equal(vl_hex_decode(hi, 2, dec, 1), digit ? 0 : -1);
    }
}

/* ---- clocks and randomness --------------------------------------------- */

/* An independent transcription of the reference SplitMix64 generator (state
 * advanced by the golden gamma, then mixed), to cross-check vl_splitmix64(). */
static uint64_t ref_splitmix_next(uint64_t *st) {
    uint64_t z = (*st += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

static void test_splitmix64(void **state) {
    (void)state;
    /* Published first outputs of SplitMix64 seeded with 0. */
    assert_true(vl_splitmix64(0) == 0xE220A8397B1DCDAFull);
    assert_true(vl_splitmix64(0x9E3779B97F4A7C15ull) == 0x6E789E6AA1B965F4ull);
    assert_true(vl_splitmix64(1) == 0x910A2DEC89025CC1ull);
    assert_true(vl_splitmix64(12345) == 0x22118258A9D111A0ull);
    assert_true(vl_splitmix64(UINT64_MAX) == 0xE4D971771B652C20ull);
    uint64_t st = 0xdeadbeef;
    for (uint64_t i = 0; i < 1000; i++) {
        uint64_t x = st;
        assert_true(ref_splitmix_next(&st) == vl_splitmix64(x));
    }
}

static void test_rng_determinism(void **state) {
    (void)state;
    vl_rng a, b, c;
    vl_rng_seed(&a, 42);
    /* Golden stream: xoshiro256** seeded with SplitMix64(42) outputs. */
    const uint64_t golden[] = {0x15780b2e0c2ec716ull, 0x6104d9866d113a7eull, 0xae17533239e499a1ull,
                               0xecb8ad4703b360a1ull, 0xfde6dc7fe2ec5e64ull};
    for (int i = 0; i < 5; i++) assert_true(vl_rng_u64(&a) == golden[i]);

    vl_rng_seed(&a, 7);
    vl_rng_seed(&b, 7);
    vl_rng_seed(&c, 8);
    int differ = 0;
    for (int i = 0; i < 1000; i++) {
        uint64_t x = vl_rng_u64(&a), y = vl_rng_u64(&b), z = vl_rng_u64(&c);
        assert_true(x == y);
        differ += x != z;
    }
    assert_true(differ > 990);
    vl_rng_seed(&a, 7);
    vl_rng_seed(&b, 7);
    for (int i = 0; i < 1000; i++) {
        assert_true(vl_rng_normal(&a) == vl_rng_normal(&b));
        assert_true(vl_rng_uniform(&a) == vl_rng_uniform(&b));
        assert_int_equal(vl_rng_below(&a, 1000), vl_rng_below(&b, 1000));
    }
}

static void test_rng_ranges(void **state) {
    (void)state;
    vl_rng r;
    vl_rng_seed(&r, 1);
    for (int i = 0; i < 1000; i++) assert_int_equal(vl_rng_below(&r, 1), 0);
    int hist[10] = {0};
    const int N = 100000;
    for (int i = 0; i < N; i++) {
        uint32_t v = vl_rng_below(&r, 10);
        assert_true(v < 10);
        hist[v]++;
    }
    for (int i = 0; i < 10; i++) /* expected 10000, sd ~95 */
        assert_true(hist[i] > 9500 && hist[i] < 10500);
    for (int i = 0; i < 10000; i++) {
        assert_true(vl_rng_below(&r, 3000000000u) < 3000000000u);
        assert_true(vl_rng_below(&r, UINT32_MAX) < UINT32_MAX);
    }
    /* 64-bit ranges: below 2^32 the same draws as vl_rng_below; above it in
     * range, and with both halves of the range reached. */
    vl_rng a, b;
    vl_rng_seed(&a, 9);
    vl_rng_seed(&b, 9);
    for (int i = 0; i < 1000; i++)
        assert_int_equal(vl_rng_below_u64(&a, 1000), vl_rng_below(&b, 1000));
    const uint64_t big = ((uint64_t)1 << 40) + 3;
    int low = 0, high = 0;
    for (int i = 0; i < 10000; i++) {
        uint64_t v = vl_rng_below_u64(&r, big);
        assert_true(v < big);
        if (v < big / 2)
            low++;
        else
            high++;
    }
    assert_true(low > 4700 && high > 4700); /* expected 5000 each, sd 50 */
    double sum = 0, sum2 = 0;
    float umin = 1, umax = 0;
    for (int i = 0; i < N; i++) {
        float u = vl_rng_uniform(&r);
        assert_true(u >= 0.0f && u < 1.0f);
        umin = fminf(umin, u);
        umax = fmaxf(umax, u);
    }
    assert_true(umin < 0.001f && umax > 0.999f);
    for (int i = 0; i < N; i++) {
        float g = vl_rng_normal(&r);
        assert_true(isfinite(g));
        sum += g;
        sum2 += (double)g * g;
    }
    double mean = sum / N, var = sum2 / N - mean * mean;
    assert_true(fabs(mean) < 0.02);
    assert_true(fabs(var - 1.0) < 0.03);
}

static void test_clock(void **state) {
    (void)state;
    assert_true(vl_clock_unix_s() > 1600000000);
    double t0 = vl_clock_mono_s();
    vl_clock_sleep_ms(20);
    double t1 = vl_clock_mono_s();
    assert_true(t1 - t0 >= 0.019);
    assert_true(t1 - t0 < 5.0);
    vl_clock_sleep_ms(0);
    vl_clock_sleep_ms(-5);
}

/* ---- parsing ----------------------------------------------------------- */

static void test_parse_i64(void **state) {
    (void)state;
    int64_t v = 0;
    assert_int_equal(vl_parse_i64("0", INT64_MIN, INT64_MAX, &v), VL_OK);
    assert_true(v == 0);
    assert_int_equal(vl_parse_i64("-17", -100, 100, &v), VL_OK);
    assert_true(v == -17);
    assert_int_equal(vl_parse_i64("+5", 0, 10, &v), VL_OK);
    assert_true(v == 5);
    assert_int_equal(vl_parse_i64("9223372036854775807", INT64_MIN, INT64_MAX, &v), VL_OK);
    assert_true(v == INT64_MAX);
    assert_int_equal(vl_parse_i64("-9223372036854775808", INT64_MIN, INT64_MAX, &v), VL_OK);
    assert_true(v == INT64_MIN);
    v = 123;
    const char *bad[] = {"9223372036854775808",
                         "-9223372036854775809",
                         "99999999999999999999",
                         "",
                         " 1",
                         "1 ",
                         "12a",
                         "-",
                         "+",
                         "0x10",
                         "1.0",
                         "1e3",
                         "--1",
                         "\t7",
                         "\xd9\xa1"};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++)
        if (vl_parse_i64(bad[i], INT64_MIN, INT64_MAX, &v) != VL_EINVAL)
            fail_msg("vl_parse_i64 accepted '%s'", bad[i]);
    assert_true(v == 123); /* untouched on failure */
    assert_int_equal(vl_parse_i64(NULL, 0, 1, &v), VL_EINVAL);
    assert_int_equal(vl_parse_i64("11", 0, 10, &v), VL_EINVAL);
    assert_int_equal(vl_parse_i64("-1", 0, 10, &v), VL_EINVAL);
    assert_int_equal(vl_parse_i64("10", 0, 10, &v), VL_OK);
    assert_int_equal(vl_parse_i64("0", 0, 10, &v), VL_OK);
}

static void test_parse_f64(void **state) {
    (void)state;
    double v = 0;
    assert_int_equal(vl_parse_f64("1.5", &v), VL_OK);
    assert_true(v == 1.5);
    assert_int_equal(vl_parse_f64("-2e3", &v), VL_OK);
    assert_true(v == -2000.0);
    assert_int_equal(vl_parse_f64(".25", &v), VL_OK);
    assert_true(v == 0.25);
    assert_int_equal(vl_parse_f64("7", &v), VL_OK);
    assert_true(v == 7.0);
    assert_int_equal(vl_parse_f64("1e-400", &v), VL_OK); /* underflow rounds to zero */
    assert_true(v == 0.0);
    assert_int_equal(vl_parse_f64("1.7976931348623157e308", &v), VL_OK);
    v = 42;
    const char *bad[] = {"",         "nan",   "NaN",    "-nan", "inf",  "-inf",
                         "Infinity", "1e400", "-1e400", "1.0x", " 1",   "1 ",
                         "abc",      "0x1p3", "-",      ".",    "1..2", "e5"};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++)
        if (vl_parse_f64(bad[i], &v) != VL_EINVAL) fail_msg("vl_parse_f64 accepted '%s'", bad[i]);
    assert_true(v == 42);
    assert_int_equal(vl_parse_f64(NULL, &v), VL_EINVAL);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_vl_fail),
        cmocka_unit_test(test_log_format),
        cmocka_unit_test(test_buf_cap),
        cmocka_unit_test(test_buf_printf_growth),
        cmocka_unit_test(test_buf_steal),
        cmocka_unit_test_setup_teardown(test_file_write_atomic, setup_tmpdir, teardown_tmpdir),
        cmocka_unit_test_setup_teardown(test_buf_read_file, setup_tmpdir, teardown_tmpdir),
        cmocka_unit_test(test_f16_known),
        cmocka_unit_test(test_f16_exhaustive),
#if defined(__FLT16_MAX__) && defined(__x86_64__)
        cmocka_unit_test(test_f16_vs_compiler),
#endif
        cmocka_unit_test(test_base64_vectors),
        cmocka_unit_test(test_base64_roundtrip),
        cmocka_unit_test(test_base64_reject),
        cmocka_unit_test(test_hex),
        cmocka_unit_test(test_splitmix64),
        cmocka_unit_test(test_rng_determinism),
        cmocka_unit_test(test_rng_ranges),
        cmocka_unit_test(test_clock),
        cmocka_unit_test(test_parse_i64),
        cmocka_unit_test(test_parse_f64),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
