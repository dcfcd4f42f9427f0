/* Base64 (RFC 4648, padded) and lowercase hex. Decoders are strict: they
 * accept exactly one encoding of each byte string, so signed values cannot be
 * re-encoded into a different-but-equivalent string. */
#include "common/common.h"

#include <limits.h>

static const char b64_alphabet[] =
    "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";

size_t base64_encoded_len(size_t n)
{
    return (n / 3 + (n % 3 != 0)) * 4 + 1;
}

void base64_encode(const uint8_t *in, size_t n, char *out)
{
    size_t i = 0, o = 0;
    for (; i + 3 <= n; i += 3) {
        uint32_t v = (uint32_t)in[i] << 16 | (uint32_t)in[i + 1] << 8 | in[i + 2];
        out[o++] = b64_alphabet[(v >> 18) & 63];
        out[o++] = b64_alphabet[(v >> 12) & 63];
        out[o++] = b64_alphabet[(v >> 6) & 63];
        out[o++] = b64_alphabet[v & 63];
    }
    if (n - i == 1) {
        uint32_t v = (uint32_t)in[i] << 16;
        out[o++] = b64_alphabet[(v >> 18) & 63];
        out[o++] = b64_alphabet[(v >> 12) & 63];
        out[o++] = '=';
        out[o++] = '=';
    } else if (n - i == 2) {
        uint32_t v = (uint32_t)in[i] << 16 | (uint32_t)in[i + 1] << 8;
        out[o++] = b64_alphabet[(v >> 18) & 63];
        out[o++] = b64_alphabet[(v >> 12) & 63];
        out[o++] = b64_alphabet[(v >> 6) & 63];
        out[o++] = '=';
    }
    out[o] = '\0';
}

static int b64_value(char c)
{
    if (c >= 'A' && c <= 'Z')
        return c - 'A';
    if (c >= 'a' && c <= 'z')
        return c - 'a' + 26;
    if (c >= '0' && c <= '9')
        return c - '0' + 52;
    if (c == '+')
        return 62;
    if (c == '/')
        return 63;
    return -1;
}

long base64_decode(const char *in, size_t n, uint8_t *out, size_t out_cap)
{
    if (n % 4 != 0)
        return -1;
    if (n == 0)
        return 0;
    size_t pad = 0;
    if (in[n - 1] == '=')
        pad = (in[n - 2] == '=') ? 2 : 1;
    size_t outlen = n / 4 * 3 - pad;
    if (outlen > out_cap || outlen > (size_t)LONG_MAX)
        return -1;

    size_t o = 0;
    for (size_t i = 0; i < n; i += 4) {
        int last = (i + 4 == n);
        int v[4];
        for (int k = 0; k < 4; k++) {
            if (last && k >= 4 - (int)pad) {
                if (in[i + k] != '=')
                    return -1;
                v[k] = 0;
            } else {
                v[k] = b64_value(in[i + k]);
                if (v[k] < 0)
                    return -1;
            }
        }
        uint32_t w = (uint32_t)v[0] << 18 | (uint32_t)v[1] << 12 | (uint32_t)v[2] << 6 |
                     (uint32_t)v[3];
        if (last && pad == 2) {
            if (w & 0xffffu) /* non-zero bits after the last byte */
                return -1;
            out[o++] = (uint8_t)(w >> 16);
        } else if (last && pad == 1) {
            if (w & 0xffu)
                return -1;
            out[o++] = (uint8_t)(w >> 16);
            out[o++] = (uint8_t)(w >> 8);
        } else {
            out[o++] = (uint8_t)(w >> 16);
            out[o++] = (uint8_t)(w >> 8);
            out[o++] = (uint8_t)w;
        }
    }
    return (long)o;
}

void hex_encode(const uint8_t *in, size_t n, char *out)
{
    static const char digits[] = "0123456789abcdef";
    for (size_t i = 0; i < n; i++) {
        out[2 * i] = digits[in[i] >> 4];
        out[2 * i + 1] = digits[in[i] & 15];
    }
    out[2 * n] = '\0';
}

static int hex_value(char c)
{
    if (c >= '0' && c <= '9')
        return c - '0';
    if (c >= 'a' && c <= 'f')
        return c - 'a' + 10;
    if (c >= 'A' && c <= 'F')
        return c - 'A' + 10;
    return -1;
}

int hex_decode(const char *in, size_t in_len, uint8_t *out, size_t out_len)
{
    if (out_len > SIZE_MAX / 2 || in_len != 2 * out_len)
        return -1;
    for (size_t i = 0; i < out_len; i++) {
        int hi = hex_value(in[2 * i]), lo = hex_value(in[2 * i + 1]);
        if (hi < 0 || lo < 0)
            return -1;
        out[i] = (uint8_t)(hi << 4 | lo);
    }
    return 0;
}
