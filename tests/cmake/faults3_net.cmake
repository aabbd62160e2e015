# Issue #37, network and process faults: refusals under attack, orphans, connection caps, token
# files, tasks whose chief has gone. The unit-level parts are tests/unit/test_log_limit.c,
# test_ps_flood.c and test_token_file.c.

# 7. The launcher SIGKILLed once training runs (its backup written): within 5 s no task of the
# job is left (before: the workers trained on alone and, finishing, deleted the backup).
foreach(mode multi_worker parameter_server)
  add_test(NAME distrain.i37.launcher_killed_leaves_no_${mode}_task
           COMMAND ${CMAKE_CURRENT_SOURCE_DIR}/cli/launcher_orphans.sh $<TARGET_FILE:distrain>
                   ${CMAKE_CURRENT_BINARY_DIR}/launcher_orphans_${mode} ${mode})
  set_tests_properties(distrain.i37.launcher_killed_leaves_no_${mode}_task
                       PROPERTIES LABELS cli TIMEOUT 120 RUN_SERIAL TRUE)
endforeach()
