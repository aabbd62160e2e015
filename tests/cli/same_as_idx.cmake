# cmake -DDISTRAIN=... -DTFRECORD_DIR=... -DSTRATEGY=... -DOUT=prefix -P same_as_idx.cmake
# Trains the same seed twice, on the built-in IDX subset and on the same digits as TFRecord
# shards in the IDX order (PNG images, one shard gzip-compressed, compression found by its first
# bytes): the pipelines yield the same elements in the same order, so the runs must end with the
# same test accuracy and loss, to the digit.
foreach(src idx tfrecord)
  set(args --quiet --strategy ${STRATEGY} --epochs 1 --threads 1 --metrics-json ${OUT}_${src}.json)
  if(src STREQUAL "tfrecord")
    list(APPEND args --data-format tfrecord --data-dir ${TFRECORD_DIR})
  endif()
  execute_process(COMMAND ${DISTRAIN} ${args} RESULT_VARIABLE rc)
  if(NOT rc EQUAL 0)
    message(FATAL_ERROR "distrain ${args} exited with ${rc}")
  endif()
  file(READ ${OUT}_${src}.json json)
  foreach(key test_accuracy test_loss train_loss steps train_examples)
    string(JSON ${src}_${key} GET ${json} ${key})
  endforeach()
endforeach()
message(STATUS "IDX: test_accuracy ${idx_test_accuracy} test_loss ${idx_test_loss}; "
               "TFRecord: test_accuracy ${tfrecord_test_accuracy} test_loss ${tfrecord_test_loss}")
foreach(key test_accuracy test_loss train_loss steps train_examples)
  if(NOT "${idx_${key}}" STREQUAL "${tfrecord_${key}}")
    message(FATAL_ERROR "${key}: IDX ${idx_${key}}, TFRecord ${tfrecord_${key}}")
  endif()
endforeach()
