# cmake -DDISTRAIN=... -DWORK=dir -DJPEG=dir -DIDX=t10k-images-idx3-ubyte.gz -P predict_inputs.cmake
# distrain predict on each kind of --input, with the seed CNN's initial weights (saved by
# --epochs 0 --save-weights): an IDX images file gives one line per image, indices 0..N-1 in
# order; one JPEG file gives the same line (class and probabilities) as that file got in a run
# over its folder, both with batches of 1 (oneDNN's kernels for other batch sizes round
# differently in the last digit).
file(REMOVE_RECURSE ${WORK})
file(MAKE_DIRECTORY ${WORK})
set(w ${WORK}/initial.weights.h5)
execute_process(COMMAND ${DISTRAIN} --epochs 0 --save-weights ${w} --quiet
                RESULT_VARIABLE rc ERROR_VARIABLE err)
if(NOT rc EQUAL 0)
  message(FATAL_ERROR "--epochs 0 --save-weights exited with ${rc}: ${err}")
endif()

execute_process(COMMAND ${DISTRAIN} predict --weights ${w} --input ${IDX} --devices cpu:0,cpu:1
                        --threads 1 --batch-size 500
                OUTPUT_VARIABLE lines RESULT_VARIABLE rc ERROR_VARIABLE err)
if(NOT rc EQUAL 0)
  message(FATAL_ERROR "predict --input ${IDX} exited with ${rc}: ${err}")
endif()
string(REGEX MATCHALL "{\"index\":[0-9]+,\"class\":[0-9],\"probabilities\":\\[[^]]*\\]}\n" rows "${lines}")
list(LENGTH rows n)
string(REGEX MATCHALL "\n" newlines "${lines}")
list(LENGTH newlines total)
if(NOT n EQUAL 2004 OR NOT total EQUAL 2004)
  message(FATAL_ERROR "predict --input ${IDX}: ${n} well-formed rows of ${total} lines, expected 2004")
endif()
list(GET rows 2003 last)
if(NOT last MATCHES "^{\"index\":2003,")
  message(FATAL_ERROR "the last row is not index 2003: ${last}")
endif()

file(GLOB threes RELATIVE ${JPEG}/test/3 ${JPEG}/test/3/*.jpg)
list(SORT threes)
list(GET threes 0 first)
execute_process(COMMAND ${DISTRAIN} predict --weights ${w} --input ${JPEG}/test --strategy one_device
                        --batch-size 1
                OUTPUT_VARIABLE folder RESULT_VARIABLE rc1 ERROR_VARIABLE err1)
execute_process(COMMAND ${DISTRAIN} predict --weights ${w} --input ${JPEG}/test/3/${first}
                        --strategy one_device
                OUTPUT_VARIABLE single RESULT_VARIABLE rc2 ERROR_VARIABLE err2)
if(NOT rc1 EQUAL 0 OR NOT rc2 EQUAL 0)
  message(FATAL_ERROR "predict on the JPEG folder / file exited with ${rc1} / ${rc2}: ${err1}${err2}")
endif()
string(REGEX MATCH "\"file\":\"3/${first}\",(\"class\":[^\n]*)" _ "${folder}")
set(in_folder "${CMAKE_MATCH_1}")
string(REGEX MATCH "^{\"index\":0,\"file\":\"${first}\",(\"class\":[^\n]*)\n$" _ "${single}")
set(alone "${CMAKE_MATCH_1}")
message(STATUS "in the folder: ${in_folder}\nalone:         ${alone}")
if(in_folder STREQUAL "" OR NOT in_folder STREQUAL alone)
  message(FATAL_ERROR "3/${first} alone gave '${single}', in its folder '${in_folder}'")
endif()
