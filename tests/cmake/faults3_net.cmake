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

# 10. A ps task SIGSTOPped until the chief gives up on it (--collective-timeout 3), then woken:
# its chief is gone for good, so it exits by itself within the connect timeout (8 s) plus 15 s,
# saying why, and the worker exits too (before: the ps waited for a shutdown that never came).
# Tasks started by hand, as on a real cluster: there is no launcher to stop them.
add_test(NAME distrain.i37.ps_woken_after_its_chief_gave_up_exits
         COMMAND python3 ${CMAKE_CURRENT_SOURCE_DIR}/cli/ps_chief_gone.py $<TARGET_FILE:distrain>
                 ${CMAKE_CURRENT_BINARY_DIR}/ps_chief_gone)
set_tests_properties(distrain.i37.ps_woken_after_its_chief_gave_up_exits
                     PROPERTIES LABELS cli TIMEOUT 150 RUN_SERIAL TRUE)
# ... and the chief SIGKILLed (no shutdown for anyone): the ps and the worker both exit within
# the connect timeout plus 15 s, saying why (before: both waited for it forever).
add_test(NAME distrain.i37.ps_and_worker_exit_when_their_chief_is_killed
         COMMAND python3 ${CMAKE_CURRENT_SOURCE_DIR}/cli/ps_chief_gone.py $<TARGET_FILE:distrain>
                 ${CMAKE_CURRENT_BINARY_DIR}/ps_chief_killed kill-chief)
set_tests_properties(distrain.i37.ps_and_worker_exit_when_their_chief_is_killed
                     PROPERTIES LABELS cli TIMEOUT 150 RUN_SERIAL TRUE)
