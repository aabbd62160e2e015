# distrain --task evaluator (TF's evaluator task, Keras's SidecarEvaluator): the cases of
# tests/cli/evaluator.sh on 3-epoch trainings of 5 steps on the MNIST subset, and its usage
# errors.
add_executable(tfevents_scalars ${CMAKE_CURRENT_SOURCE_DIR}/cli/tfevents_scalars.c)
target_link_libraries(tfevents_scalars PRIVATE dist)
target_compile_options(tfevents_scalars PRIVATE ${DIST_WARNINGS})

set(evaluator_sh ${CMAKE_CURRENT_SOURCE_DIR}/cli/evaluator.sh)
set(evaluator_work ${CMAKE_CURRENT_BINARY_DIR}/evaluator)
function(evaluator_case name)
  add_test(NAME distrain.evaluator.${name}
           COMMAND ${evaluator_sh} ${name} $<TARGET_FILE:distrain> $<TARGET_FILE:tfevents_scalars>
                   ${PROJECT_SOURCE_DIR}/src/data/mnist_subset ${evaluator_work})
  set_tests_properties(distrain.evaluator.${name} PROPERTIES LABELS cli TIMEOUT 120 ${ARGN})
endfunction()
evaluator_case(train FIXTURES_SETUP evaluator_checkpoints)
evaluator_case(during FIXTURES_SETUP evaluator_events)
evaluator_case(cluster)
evaluator_case(cleanup)
evaluator_case(idle)
foreach(name after corrupt removed timeout disappears)
  evaluator_case(${name} FIXTURES_REQUIRED evaluator_checkpoints)
endforeach()

set(evaluator_expect ${CMAKE_CURRENT_SOURCE_DIR}/cli/expect.sh)
function(evaluator_usage name text)
  add_test(NAME distrain.evaluator.usage_${name}
           COMMAND ${evaluator_expect} 2 ${text} $<TARGET_FILE:distrain> ${ARGN})
  set_tests_properties(distrain.evaluator.usage_${name} PROPERTIES LABELS cli TIMEOUT 60)
endfunction()
evaluator_usage(save_weights "--task evaluator: --save-weights does not apply: the evaluator trains nothing"
                --task evaluator --checkpoint-dir ck --save-weights w.safetensors)
evaluator_usage(workers "--task evaluator: --workers does not apply: the evaluator is one process"
                --task evaluator --checkpoint-dir ck --strategy multi_worker --workers 2)
evaluator_usage(early_stopping "--early-stopping-patience does not apply: a training that stops before --epochs"
                --task evaluator --checkpoint-dir ck --early-stopping-patience 2)
evaluator_usage(no_checkpoint_dir "--task evaluator needs --checkpoint-dir" --task evaluator)
evaluator_usage(epochs_zero "--task evaluator: --epochs 0 names no checkpoint"
                --task evaluator --checkpoint-dir ck --epochs 0)
evaluator_usage(checkpoint_dir_is_a_file "'${CMAKE_CURRENT_SOURCE_DIR}/CMakeLists.txt' exists and is not a directory"
                --task evaluator --checkpoint-dir ${CMAKE_CURRENT_SOURCE_DIR}/CMakeLists.txt)
evaluator_usage(timeout_without_evaluator "--evaluator-timeout needs --task evaluator"
                --evaluator-timeout 5)
evaluator_usage(bad_timeout "invalid value '0' for --evaluator-timeout"
                --task evaluator --checkpoint-dir ck --evaluator-timeout 0)
evaluator_usage(unknown_task "invalid value 'ps' for --task: expected train or evaluator" --task ps)
# TF_CONFIG's evaluator task: the same checks, and no contradiction with --task
set(evaluator_tf_config
    "TF_CONFIG={\"cluster\":{\"worker\":[\"localhost:1\"],\"evaluator\":[\"localhost:2\"]},\"task\":{\"type\":\"evaluator\",\"index\":0}}")
add_test(NAME distrain.evaluator.usage_tf_config_without_checkpoint_dir
         COMMAND ${CMAKE_COMMAND} -E env ${evaluator_tf_config}
                 ${evaluator_expect} 2 "--task evaluator needs --checkpoint-dir"
                 $<TARGET_FILE:distrain> --strategy multi_worker)
add_test(NAME distrain.evaluator.usage_tf_config_contradicts_task
         COMMAND ${CMAKE_COMMAND} -E env ${evaluator_tf_config}
                 ${evaluator_expect} 2 "--task train, but TF_CONFIG says this task is an 'evaluator'"
                 $<TARGET_FILE:distrain> --strategy multi_worker --task train)
set_tests_properties(distrain.evaluator.usage_tf_config_without_checkpoint_dir
                     distrain.evaluator.usage_tf_config_contradicts_task
                     PROPERTIES LABELS cli TIMEOUT 60)

# The during case's validation scalars read by TensorBoard and TensorFlow themselves (the venv of
# the conformance.venv fixture, tests/cmake/conformance.cmake).
add_test(NAME conformance.evaluator_events
         COMMAND ${DIST_CONF_VENV}/bin/python
                 ${CMAKE_CURRENT_SOURCE_DIR}/conformance/check_evaluator_events.py
                 ${evaluator_work}/during/logs/validation ${evaluator_work}/during/scalars)
set_tests_properties(conformance.evaluator_events PROPERTIES
                     FIXTURES_REQUIRED "tf_venv;evaluator_events" LABELS conformance TIMEOUT 300
                     ENVIRONMENT "TF_CPP_MIN_LOG_LEVEL=2")
