/* The coordinator's TLS context: made at start from the certificate chain
 * and key, and made again on SIGHUP, so that a renewed certificate (a
 * Let's Encrypt renewal, say) is served without dropping a connection.
 * A connection keeps the context it was accepted with (OpenSSL counts the
 * references), so the old one lives until its last connection closes. */
#include <stdio.h>
#include <string.h>
#include <time.h>

#include <event2/event.h>
#include <openssl/err.h>
#include <openssl/ssl.h>
#include <openssl/x509.h>

#include "coordinator/coord.h"
#include "coordinator/conn/conn.h"

static void ssl_error(vl_error *err, const char *what, const char *path) {
    char detail[200] = "no detail";
    unsigned long code = ERR_get_error();
    if (code) ERR_error_string_n(code, detail, sizeof detail);
    ERR_clear_error();
    vl_fail(err, VL_EINVAL, "%s %s: %s", what, path, detail);
}

SSL_CTX *coord_tls_ctx_new(const char *cert, const char *key, vl_error *err) {
    SSL_CTX *ctx = SSL_CTX_new(TLS_server_method());
    if (!ctx) {
        ssl_error(err, "cannot create a TLS context", "");
        return NULL;
    }
    SSL_CTX_set_min_proto_version(ctx, TLS1_2_VERSION);
    /* Idle keep-alive connections (peers between tasks) need no buffers. */
    SSL_CTX_set_mode(ctx, SSL_MODE_RELEASE_BUFFERS);
    SSL_CTX_set_options(ctx, SSL_OP_NO_COMPRESSION | SSL_OP_NO_RENEGOTIATION |
                                 SSL_OP_CIPHER_SERVER_PREFERENCE);
    /* Forward secret AEAD suites only: ECDHE with AES-GCM or ChaCha20-
     * Poly1305 for TLS 1.2, and the same ciphers under TLS 1.3 (which has
     * only ephemeral key exchange), on X25519 or NIST curves. */
    if (SSL_CTX_set_cipher_list(ctx, "ECDHE+AESGCM:ECDHE+CHACHA20:!aNULL:!eNULL") != 1 ||
        SSL_CTX_set_ciphersuites(ctx, "TLS_AES_256_GCM_SHA384:TLS_CHACHA20_POLY1305_SHA256:"
                                      "TLS_AES_128_GCM_SHA256") != 1 ||
        SSL_CTX_set1_groups_list(ctx, "X25519:P-256:P-384") != 1) {
        ssl_error(err, "cannot set TLS ciphers", "");
        goto fail;
    }
    if (SSL_CTX_use_certificate_chain_file(ctx, cert) != 1) {
        ssl_error(err, "cannot load the certificate chain from", cert);
        goto fail;
    }
    if (SSL_CTX_use_PrivateKey_file(ctx, key, SSL_FILETYPE_PEM) != 1) {
        if (ERR_GET_REASON(ERR_peek_last_error()) == X509_R_KEY_VALUES_MISMATCH) {
            vl_fail(err, VL_EINVAL, "the key in %s does not match the certificate in %s", key,
                    cert);
            ERR_clear_error();
        } else {
            ssl_error(err, "cannot load the private key from", key);
        }
        goto fail;
    }
    if (SSL_CTX_check_private_key(ctx) != 1) {
        vl_fail(err, VL_EINVAL, "the key in %s does not match the certificate in %s", key, cert);
        ERR_clear_error();
        goto fail;
    }
    return ctx;
fail:
    SSL_CTX_free(ctx);
    return NULL;
}

/* "CN=..., until 2027-02-25" for the log, from the context's leaf. */
static void describe(SSL_CTX *ctx, char *out, size_t cap) {
    X509 *leaf = SSL_CTX_get0_certificate(ctx);
    char subject[160] = "?", until[40] = "?";
    if (leaf) {
        X509_NAME_oneline(X509_get_subject_name(leaf), subject, sizeof subject);
        struct tm tm;
        if (ASN1_TIME_to_tm(X509_get0_notAfter(leaf), &tm) == 1)
            strftime(until, sizeof until, "%Y-%m-%dT%H:%M:%SZ", &tm);
    }
    snprintf(out, cap, "%s, valid until %s", subject, until);
}

void coord_tls_on_sighup(evutil_socket_t sig, short what, void *arg) {
    (void)sig;
    (void)what;
    coord_server *srv = arg;
    vl_error err = {0};
    SSL_CTX *ctx = coord_tls_ctx_new(srv->conns.cert_path, srv->conns.key_path, &err);
    if (!ctx) {
        vl_log_error("SIGHUP: certificate not reloaded, still serving the old one: %s", err.msg);
        return;
    }
    SSL_CTX_free(srv->conns.ssl);
    srv->conns.ssl = ctx;
    char what_now[256];
    describe(ctx, what_now, sizeof what_now);
    vl_log_info("SIGHUP: certificate reloaded from %s (%s); new connections get it",
                srv->conns.cert_path, what_now);
}
