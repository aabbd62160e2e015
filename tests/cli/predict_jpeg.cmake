# cmake -DDISTRAIN=... -DWORK=dir -DJPEG=dir -P predict_jpeg.cmake
# JPEG = OUT of make_jpeg_mnist (train/<digit>/*.jpg, test/<digit>/*.jpg). Trains briefly on
# the embedded MNIST subset and saves the weights, evaluates them on the JPEG test split with
# --data-format jpeg-folder --epochs 0, and runs distrain predict on the folder JPEG/test: every
# image gets one JSON line, and the share of lines whose class is the digit folder of their file
# must equal the evaluation's test_accuracy (6 decimals, the metrics JSON's precision).
file(REMOVE_RECURSE ${WORK})
file(MAKE_DIRECTORY ${WORK})
set(w ${WORK}/weights.safetensors)
execute_process(COMMAND ${DISTRAIN} --strategy mirrored --devices cpu:0,cpu:1 --threads 1 --epochs 1
                        --steps-per-epoch 20 --save-weights ${w} --quiet
                RESULT_VARIABLE rc ERROR_VARIABLE err)
if(NOT rc EQUAL 0)
  message(FATAL_ERROR "the training run exited with ${rc}: ${err}")
endif()
execute_process(COMMAND ${DISTRAIN} --data-format jpeg-folder --data-dir ${JPEG} --epochs 0
                        --load-weights ${w} --metrics-json ${WORK}/eval.json --quiet
                RESULT_VARIABLE rc ERROR_VARIABLE err)
if(NOT rc EQUAL 0)
  message(FATAL_ERROR "the evaluation exited with ${rc}: ${err}")
endif()
execute_process(COMMAND ${DISTRAIN} predict --weights ${w} --input ${JPEG}/test --devices cpu:0,cpu:1
                        --threads 1 --batch-size 48
                OUTPUT_VARIABLE lines RESULT_VARIABLE rc ERROR_VARIABLE err)
if(NOT rc EQUAL 0)
  message(FATAL_ERROR "distrain predict exited with ${rc}: ${err}")
endif()
file(READ ${WORK}/eval.json json)
string(JSON accuracy GET ${json} test_accuracy)
string(JSON examples GET ${json} test_examples)
string(REGEX MATCHALL "\"file\":\"[0-9]/[^\"]*\",\"class\":[0-9]" rows "${lines}")
list(LENGTH rows total)
set(correct 0)
foreach(row IN LISTS rows)
  string(REGEX MATCH "\"file\":\"([0-9])/[^\"]*\",\"class\":([0-9])" _ "${row}")
  if(CMAKE_MATCH_1 EQUAL CMAKE_MATCH_2)
    math(EXPR correct "${correct} + 1")
  endif()
endforeach()
if(NOT total EQUAL examples)
  message(FATAL_ERROR "distrain predict printed ${total} rows for ${examples} test images")
endif()
# correct / total to 6 decimals, rounded as printf's %.6f (integers only in CMake's math)
math(EXPR scaled "(${correct} * 10000000 / ${total} + 5) / 10")
math(EXPR int_part "${scaled} / 1000000")
math(EXPR frac "${scaled} % 1000000")
string(LENGTH "${frac}" n)
while(n LESS 6)
  set(frac "0${frac}")
  string(LENGTH "${frac}" n)
endwhile()
set(predicted "${int_part}.${frac}")
message(STATUS "predict: ${correct}/${total} = ${predicted}; evaluation: ${accuracy}")
if(NOT predicted EQUAL accuracy) # numerically: the JSON reader drops trailing zeros
  message(FATAL_ERROR "distrain predict's accuracy ${predicted} differs from the evaluation's ${accuracy}")
endif()
