# cmake -DDISTRAIN=... -DSTRATEGY=... -DOUT=metrics.json -P accuracy.cmake
# Trains with the defaults and requires test_accuracy >= 0.95 in the metrics JSON.
execute_process(COMMAND ${DISTRAIN} --strategy ${STRATEGY} --quiet --metrics-json ${OUT}
                RESULT_VARIABLE rc)
if(NOT rc EQUAL 0)
  message(FATAL_ERROR "distrain --strategy ${STRATEGY} exited with ${rc}")
endif()
file(READ ${OUT} json)
string(JSON acc GET ${json} test_accuracy)
string(JSON replicas GET ${json} replicas)
string(JSON steps GET ${json} steps)
message(STATUS "${STRATEGY}: test_accuracy ${acc}, ${replicas} replica(s), ${steps} steps")
if(acc LESS 0.95)
  message(FATAL_ERROR "test accuracy ${acc} < 0.95")
endif()
if(NOT steps EQUAL 625)
  message(FATAL_ERROR "expected 625 steps (5 epochs x 125), got ${steps}")
endif()
