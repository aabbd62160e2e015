# cmake -DEXAMPLE=... -DSTEPS=50 -DMAX_LOSS=1.2 -P example_loss.cmake
# Runs the custom training loop example and checks what it is for, not only a line of output:
# it exits 0, trains the steps asked for, and its mean loss falls from the first report to the
# last and ends below MAX_LOSS (chance for 10 classes is ln 10 = 2.30).
execute_process(COMMAND ${EXAMPLE} ${STEPS} RESULT_VARIABLE rc OUTPUT_VARIABLE out
                ERROR_VARIABLE err)
message(STATUS "${out}${err}")
if(NOT rc EQUAL 0)
  message(FATAL_ERROR "${EXAMPLE} ${STEPS} exited with ${rc}")
endif()
if(NOT out MATCHES "trained ${STEPS} steps")
  message(FATAL_ERROR "no 'trained ${STEPS} steps' line")
endif()
string(REGEX MATCHALL "mean loss [0-9.]+" reports "${out}")
list(LENGTH reports n)
if(n LESS 2)
  message(FATAL_ERROR "expected at least 2 loss reports, got ${n}")
endif()
list(GET reports 0 first)
list(GET reports -1 last)
string(REPLACE "mean loss " "" first "${first}")
string(REPLACE "mean loss " "" last "${last}")
if(NOT last LESS first)
  message(FATAL_ERROR "the loss did not fall: ${first} -> ${last}")
endif()
if(NOT last LESS ${MAX_LOSS})
  message(FATAL_ERROR "final mean loss ${last} is not below ${MAX_LOSS}")
endif()
