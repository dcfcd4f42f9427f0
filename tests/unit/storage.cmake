volley_unit_test(test_storage volley_storage)
# Updates, version commits and pruning, rounds, refused versions, factors.
volley_unit_test(test_storage_versions volley_storage)
volley_unit_test(test_storage_schema volley_storage)
volley_unit_test(test_bodies volley_storage)
# The server's lock beside the database, and writes on a full disk.
volley_unit_test(test_storage_lock volley_storage)
# Power cuts and disk faults at chosen moments of a transaction, with the
# layer of tests/faults loaded into the test (absent under the sanitizers).
if(TARGET volley_powercut)
  volley_unit_test(test_powercut volley_storage)
  set_tests_properties(test_powercut PROPERTIES
    ENVIRONMENT "LD_PRELOAD=$<TARGET_FILE:volley_powercut>")
endif()
