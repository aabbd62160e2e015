# cmake -DDISTRAIN=... [-DSTRATEGY=...] [-DARGS=a;b;c] -DOUT=metrics.json [-DMIN_ACCURACY=0.95]
#       [-DSTEPS=625] -P accuracy.cmake
# Trains (defaults: 5 epochs, batch 64, Adam 0.001) and checks test_accuracy and the step
# count in the metrics JSON.
if(NOT DEFINED MIN_ACCURACY)
  set(MIN_ACCURACY 0.95)
endif()
if(NOT DEFINED STEPS)
  set(STEPS 625) # 5 epochs x 125 steps of the built-in subset
endif()
set(args --quiet --metrics-json ${OUT})
if(DEFINED STRATEGY)
  list(APPEND args --strategy ${STRATEGY})
endif()
execute_process(COMMAND ${DISTRAIN} ${args} ${ARGS} RESULT_VARIABLE rc)
if(NOT rc EQUAL 0)
  message(FATAL_ERROR "distrain ${args} ${ARGS} exited with ${rc}")
endif()
file(READ ${OUT} json)
string(JSON acc GET ${json} test_accuracy)
string(JSON replicas GET ${json} replicas)
string(JSON steps GET ${json} steps)
message(STATUS "test_accuracy ${acc}, ${replicas} replica(s), ${steps} steps")
if(acc LESS ${MIN_ACCURACY})
  # the whole metrics file: train loss and accuracy, steps, examples, which tell a run that did
  # not learn from an evaluation that went wrong (the file is overwritten by the next run)
  message(FATAL_ERROR "test accuracy ${acc} < ${MIN_ACCURACY}; ${OUT}:\n${json}")
endif()
if(NOT steps EQUAL ${STEPS})
  message(FATAL_ERROR "expected ${STEPS} steps, got ${steps}")
endif()
