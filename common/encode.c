/* Base64 (RFC 4648 section 4: standard alphabet, padded) and hex, on top of
 * libsodium's codecs, which neither branch on nor index tables with the
 * bytes they convert, so secret keys passing through them do not show in
 * their timing. Decoders are strict: no ignored characters, exact padding,
 * zero trailing bits, nothing after the last group, so a signed value has
 * exactly one base64 spelling.
 *
 * These codecs keep no state, so they need no sodium_init(); that call only
 * opens the random device and picks CPU-specific primitives. */
#include "common/common.h"

#include <limits.h>
#include <sodium.h>

size_t vl_base64_encoded_len(size_t n) {
    return sodium_base64_encoded_len(n, sodium_base64_VARIANT_ORIGINAL);
}

void vl_base64_encode(const uint8_t *in, size_t n, char *out) {
    sodium_bin2base64(out, vl_base64_encoded_len(n), in, n, sodium_base64_VARIANT_ORIGINAL);
}

long vl_base64_decode(const char *in, size_t n, uint8_t *out, size_t out_cap) {
    /* libsodium 1.0.18 (Debian 12's) reads each character as a
     * signed char, so every byte from 0x80 up decodes as a base64 digit and
     * a signature would gain other spellings. No such byte is base64; the
     * scan keeps to the input's length, not its contents. */
    unsigned high = 0;
    for (size_t i = 0; i < n; i++) high |= (unsigned char)in[i];
    if (high & 0x80u) return -1;
    /* Nothing to decode, and out may be NULL, which libsodium's arguments
     * are declared never to be. */
    if (n == 0) return 0;
    size_t got = 0;
    /* No ignore set and no end pointer: any byte outside the alphabet, any
     * missing or extra '=', and anything after the padding fail the call. */
    if (sodium_base642bin(out, out_cap, in, n, NULL, &got, NULL, sodium_base64_VARIANT_ORIGINAL) !=
        0)
        return -1;
    if (got > (size_t)LONG_MAX) return -1;
    return (long)got;
}

void vl_hex_encode(const uint8_t *in, size_t n, char *out) {
    sodium_bin2hex(out, 2 * n + 1, in, n);
}

int vl_hex_decode(const char *in, size_t in_len, uint8_t *out, size_t out_len) {
    /* The length check comes first: libsodium would take a shorter string
     * and leave the rest of out unwritten. */
    if (out_len > SIZE_MAX / 2 || in_len != 2 * out_len) return -1;
    if (out_len == 0) return 0; /* as with base64: out may be NULL */
    size_t got = 0;
    if (sodium_hex2bin(out, out_len, in, in_len, NULL, &got, NULL) != 0 || got != out_len)
        return -1;
    return 0;
}
