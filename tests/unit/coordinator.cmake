volley_unit_test(test_coordinator volley_coord_api)
# The run configuration: parsing, defaults, field errors, schedule, durations.
volley_unit_test(test_coord_config volley_coord_base)
# The table of its fields: every bound, choice, key and default, walked.
volley_unit_test(test_config_fields volley_coord_config)
volley_unit_test(test_guard volley_coord_conn)
volley_unit_test(test_auth volley_coordinator_core)
volley_unit_test(test_nonce_log volley_coord_conn)
volley_unit_test(test_merge volley_coordinator_core)
volley_unit_test(test_longpoll volley_coordinator_core)
# A body that does not match its Content-Digest, through a real server.
volley_unit_test(test_upload_digest volley_coordinator_core)
# An upload's norm, stored with it by the route: the number the merge uses.
volley_unit_test(test_upload_norm volley_coordinator_core)
volley_unit_test(test_async volley_coord_ops)
# The writer when a batch's COMMIT fails.
volley_unit_test(test_writer_commit volley_coord_run)
# A full disk under a running coordinator: one report, merges retried with
# a capped backoff, nothing acknowledged lost.
volley_unit_test(test_writer_full volley_coordinator_core)
if(TARGET volley_powercut AND TARGET test_writer_full)
  # Its upload's body fails with ENOSPC through the fault layer.
  set_tests_properties(test_writer_full PROPERTIES ENVIRONMENT
    "LD_PRELOAD=$<TARGET_FILE:volley_powercut>;OMP_NUM_THREADS=1;OPENBLAS_NUM_THREADS=1")
endif()
volley_unit_test(test_async_rules volley_coord_sched)
volley_unit_test(test_export volley_coord_cli)
volley_unit_test(test_robust volley_coord_base)
volley_unit_test(test_limits volley_coord_conn)
# The connection rules (idle, per address, bodies over the budget).
volley_unit_test(test_conns volley_coordinator_core)
volley_unit_test(test_coord_shards volley_coord_run)
# GPT-2 small from a run configuration; its forward and backward pass is a
# second entry of the same program, which a sanitizer build reports skipped.
volley_unit_test(test_gpt2 volley_coord_config)
if(TARGET test_gpt2)
  # It also parses deploy/coordinator.shards.example.json, GPT-2 small on
  # FineWeb shards, so the example cannot rot.
  target_compile_definitions(test_gpt2 PRIVATE VOLLEY_SOURCE_DIR="${CMAKE_SOURCE_DIR}")
  target_compile_definitions(test_async PRIVATE VOLLEY_SOURCE_DIR="${CMAKE_SOURCE_DIR}")
  add_test(NAME test_gpt2_step COMMAND test_gpt2 step)
  set_tests_properties(test_gpt2_step PROPERTIES SKIP_RETURN_CODE 77 TIMEOUT 600
    ENVIRONMENT "OMP_NUM_THREADS=2;OPENBLAS_NUM_THREADS=1")
endif()
volley_unit_test(test_coord_kfac volley_coord_run)
# A classification run (model.kind "mlp", data.kind "local"): its
# configuration, model file, test set and scoring.
volley_unit_test(test_coord_classify volley_coord_run)
# The cut-layer gradient a split run answers with, against finite differences.
volley_unit_test(test_split_grad volley_coordinator_core)
