# Issue #38, "What a user hits, round 3": one test per behaviour, each failing before its fix.
set(i38_sh ${CMAKE_CURRENT_SOURCE_DIR}/cli/user_issues3.sh)
function(i38_usage name rc text)
  add_test(NAME distrain.i38.${name}
           COMMAND ${CMAKE_CURRENT_SOURCE_DIR}/cli/expect.sh ${rc} ${text} $<TARGET_FILE:distrain> ${ARGN})
  set_tests_properties(distrain.i38.${name} PROPERTIES LABELS cli TIMEOUT 60)
endfunction()

# 4. With one busy process beside it, the default thread count reaches >= 0.9x the images/s of
# --threads 1. Alone on the machine: it measures speed against a second process.
add_test(NAME distrain.i38.busy_core_default_threads
         COMMAND ${i38_sh} $<TARGET_FILE:distrain> ${CMAKE_CURRENT_BINARY_DIR}/i38 busy_core)
set_tests_properties(distrain.i38.busy_core_default_threads PROPERTIES LABELS cli TIMEOUT 300
                     RUN_SERIAL TRUE SKIP_RETURN_CODE 77)
# 5 and 14. parameter_server tasks started by hand share the cores; the metrics count workers.
add_test(NAME distrain.i38.ps_share_host
         COMMAND ${i38_sh} $<TARGET_FILE:distrain> ${CMAKE_CURRENT_BINARY_DIR}/i38 ps_share_host
                 ${CMAKE_CURRENT_SOURCE_DIR}/cli/ps_cluster.py)
set_tests_properties(distrain.i38.ps_share_host PROPERTIES LABELS cli TIMEOUT 300 RUN_SERIAL TRUE)
# 11. Ctrl-C: stop at the step, keep the weights and the backup, exit 130.
foreach(part interrupt interrupt_launcher)
  add_test(NAME distrain.i38.${part}
           COMMAND ${i38_sh} $<TARGET_FILE:distrain> ${CMAKE_CURRENT_BINARY_DIR}/i38 ${part})
  set_tests_properties(distrain.i38.${part} PROPERTIES LABELS cli TIMEOUT 400)
endforeach()
set_tests_properties(distrain.i38.interrupt_launcher PROPERTIES RUN_SERIAL TRUE)
# 10. The --lr-schedule example of --help, pasted unquoted into a shell.
add_test(NAME distrain.i38.lr_schedule_unquoted
         COMMAND ${i38_sh} $<TARGET_FILE:distrain> ${CMAKE_CURRENT_BINARY_DIR}/i38 lr_schedule_unquoted)
set_tests_properties(distrain.i38.lr_schedule_unquoted PROPERTIES LABELS cli TIMEOUT 120)
# 7, 8. tpu: --devices is refused; a global batch that does not split over --tpu-cores is a
# usage error before anything starts.
i38_usage(tpu_devices_refused 2 "--devices does not apply to --strategy tpu" --strategy tpu --devices gpu:3)
i38_usage(tpu_batch_not_divisible 2 "--batch-size 64 does not split evenly over --tpu-cores 3"
          --strategy tpu --tpu-cores 3)
# 12. Under an MPI launcher with more than one process, only multi_worker joins them.
add_test(NAME distrain.i38.mpi_world_needs_multi_worker
         COMMAND ${CMAKE_COMMAND} -E env OMPI_COMM_WORLD_SIZE=2
                 ${CMAKE_CURRENT_SOURCE_DIR}/cli/expect.sh 2 "started by MPI as one of 2 processes"
                 $<TARGET_FILE:distrain> --strategy mirrored --epochs 1)
set_tests_properties(distrain.i38.mpi_world_needs_multi_worker PROPERTIES LABELS cli TIMEOUT 60)
# 13. --epochs 0 needs weights to evaluate (or a file to write the initial ones to).
i38_usage(epochs_0_without_weights 2 "--epochs 0 trains nothing" --epochs 0)
