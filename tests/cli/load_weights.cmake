# cmake -DDISTRAIN=... -DWORK=dir -DWEIGHTS=name(.safetensors|.weights.h5) [-DEVAL_ARGS=a;b]
#       -P load_weights.cmake
# Trains briefly (mirrored on 2 CPU replicas) and saves the weights as WEIGHTS, then evaluates
# them alone with --load-weights WEIGHTS --epochs 0 under EVAL_ARGS (default --strategy
# one_device): it must exit 0 and print the same "Test loss: ... - test accuracy: ..." line, and
# write the same test metrics, as the run that saved them.
file(REMOVE_RECURSE ${WORK})
file(MAKE_DIRECTORY ${WORK})
set(w ${WORK}/${WEIGHTS})
execute_process(COMMAND ${DISTRAIN} --strategy mirrored --devices cpu:0,cpu:1 --threads 1 --epochs 1
                        --steps-per-epoch 20 --save-weights ${w} --metrics-json ${WORK}/train.json
                OUTPUT_VARIABLE out1 ERROR_VARIABLE err1 RESULT_VARIABLE rc1)
if(NOT rc1 EQUAL 0)
  message(FATAL_ERROR "the training run exited with ${rc1}: ${err1}")
endif()
if(NOT DEFINED EVAL_ARGS)
  set(EVAL_ARGS --strategy one_device)
endif()
execute_process(COMMAND ${DISTRAIN} ${EVAL_ARGS} --epochs 0 --load-weights ${w}
                        --metrics-json ${WORK}/eval.json
                OUTPUT_VARIABLE out2 ERROR_VARIABLE err2 RESULT_VARIABLE rc2)
if(NOT rc2 EQUAL 0)
  message(FATAL_ERROR "--load-weights ${w} --epochs 0 exited with ${rc2}: ${err2}")
endif()
string(REGEX MATCH "Test loss: [0-9.]+ - test accuracy: [0-9.]+ \\([0-9]+ examples\\)" line1 "${out1}")
string(REGEX MATCH "Test loss: [0-9.]+ - test accuracy: [0-9.]+ \\([0-9]+ examples\\)" line2 "${out2}")
message(STATUS "saved:  ${line1}\nloaded: ${line2}")
if(line1 STREQUAL "" OR NOT line1 STREQUAL line2)
  message(FATAL_ERROR "the evaluation of the loaded weights printed '${line2}', the run that saved them '${line1}'")
endif()
file(READ ${WORK}/train.json j1)
file(READ ${WORK}/eval.json j2)
foreach(key test_accuracy test_loss test_examples)
  string(JSON a GET ${j1} ${key})
  string(JSON b GET ${j2} ${key})
  if(NOT a STREQUAL b)
    message(FATAL_ERROR "${key}: ${b} after loading, ${a} when saved")
  endif()
endforeach()
string(JSON steps GET ${j2} steps)
if(NOT steps EQUAL 0)
  message(FATAL_ERROR "--epochs 0 ran ${steps} training steps")
endif()
