# cmake -DEXAMPLE=... -DMIN_ACCURACY=0.97 -P example_accuracy.cmake
# Runs an example that trains and then prints "test accuracy: A (...)", and checks what it is
# for: it exits 0 and A (on the built-in MNIST subset's 2,004 test images) is at least
# MIN_ACCURACY.
execute_process(COMMAND ${EXAMPLE} RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err)
message(STATUS "${out}${err}")
if(NOT rc EQUAL 0)
  message(FATAL_ERROR "${EXAMPLE} exited with ${rc}")
endif()
if(NOT out MATCHES "test accuracy: ([0-9.]+)")
  message(FATAL_ERROR "no 'test accuracy: ...' line")
endif()
set(accuracy ${CMAKE_MATCH_1})
if(accuracy LESS ${MIN_ACCURACY})
  message(FATAL_ERROR "test accuracy ${accuracy} is below ${MIN_ACCURACY}")
endif()
