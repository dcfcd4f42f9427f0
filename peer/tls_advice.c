/*
 * What a volunteer should do about a TLS failure (peer/http.h): libcurl's
 * code and OpenSSL's verify result turned into one sentence naming the
 * certificate's fault and the fix, instead of curl's own text ("SSL
 * certificate problem: unable to get local issuer certificate"), which
 * says neither.
 */
#include <stdio.h>
#include <string.h>

#include <curl/curl.h>

#include "peer/http.h"

/* OpenSSL's X509_V_ERR_* values (x509_vfy.h), stable since 1.0; named here
 * so that the peer needs no OpenSSL headers of its own. */
enum {
    V_OK = 0,
    V_UNSPECIFIED = 1,        /* UNSPECIFIED: what curl leaves after its own name check */
    V_ISSUER = 2,             /* UNABLE_TO_GET_ISSUER_CERT */
    V_NOT_YET_VALID = 9,      /* CERT_NOT_YET_VALID */
    V_EXPIRED = 10,           /* CERT_HAS_EXPIRED */
    V_SELF_SIGNED = 18,       /* DEPTH_ZERO_SELF_SIGNED_CERT */
    V_SELF_SIGNED_CHAIN = 19, /* SELF_SIGNED_CERT_IN_CHAIN */
    V_ISSUER_LOCAL = 20,      /* UNABLE_TO_GET_ISSUER_CERT_LOCALLY */
    V_LEAF_SIGNATURE = 21,    /* UNABLE_TO_VERIFY_LEAF_SIGNATURE */
    V_UNTRUSTED = 27,         /* CERT_UNTRUSTED */
    V_HOSTNAME = 62,          /* HOSTNAME_MISMATCH */
    V_IP = 64,                /* IP_ADDRESS_MISMATCH */
};

/* The host of an https:// origin, without port or brackets. */
static void host_of(const char *base, char *out, size_t cap) {
    const char *p = strncmp(base, "https://", 8) == 0 ? base + 8 : base;
    size_t n;
    if (*p == '[') {
        p++;
        n = strcspn(p, "]");
    } else {
        n = strcspn(p, ":/");
    }
    if (n >= cap) n = cap - 1;
    memcpy(out, p, n);
    out[n] = '\0';
}

int peer_tls_advice(int curl_code, long verify_result, const char *curl_text, const char *cacert,
                    const char *base, char *out, size_t cap) {
    int have_ca = cacert && *cacert;
    char host[256];
    host_of(base, host, sizeof host);
    if (curl_code == CURLE_SSL_CACERT_BADFILE) {
        snprintf(out, cap,
                 "the CA file %s (--cacert) is not a PEM certificate curl can load; use the CA "
                 "file the operator gave you",
                 have_ca ? cacert : "of this system");
        return 1;
    }
    if (curl_code != CURLE_PEER_FAILED_VERIFICATION) return 0;
    switch (verify_result) {
    case V_EXPIRED:
        snprintf(out, cap,
                 "the coordinator's certificate has expired; tell its operator (or, if this "
                 "machine's clock is wrong, set it right)");
        return 1;
    case V_NOT_YET_VALID:
        snprintf(out, cap,
                 "the coordinator's certificate is not valid yet; check this machine's clock "
                 "and date");
        return 1;
    case V_HOSTNAME:
    case V_IP: break;
    case V_SELF_SIGNED:
    case V_SELF_SIGNED_CHAIN:
    case V_ISSUER:
    case V_ISSUER_LOCAL:
    case V_LEAF_SIGNATURE:
    case V_UNTRUSTED:
        if (have_ca)
            snprintf(out, cap,
                     "the coordinator's certificate is not signed by the CA in --cacert %s; use "
                     "the CA file the operator gave you",
                     cacert);
        else if (verify_result == V_SELF_SIGNED || verify_result == V_SELF_SIGNED_CHAIN)
            snprintf(out, cap,
                     "the coordinator's certificate is self-signed and no --cacert was given; "
                     "join with --cacert FILE, the CA file the operator gave you");
        else
            snprintf(out, cap,
                     "the coordinator's certificate is not signed by a CA this system trusts "
                     "and no --cacert was given; join with --cacert FILE, the CA file the "
                     "operator gave you");
        return 1;
    default:
        /* curl checks the name itself, after OpenSSL's verification. */
        if ((verify_result != V_OK && verify_result != V_UNSPECIFIED) || !curl_text ||
            !strstr(curl_text, "name"))
            return 0;
    }
    snprintf(out, cap,
             "the coordinator's certificate does not name %s; use the address the operator gave "
             "you (the one its certificate names)",
             host);
    return 1;
}
