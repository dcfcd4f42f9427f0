volley_unit_test(test_crypto volley_crypto)
# RFC 9421 signatures: base, RFC example, tampering, header grammar, members.
volley_unit_test(test_httpsig volley_crypto)
