# Conformance of the tape's math ops against TensorFlow: every op of dist/tape.h's math section
# runs on fixed inputs (with planted ties and zeros), and tape_ops_conformance.py recomputes the
# output and the gradient of every input with tf.GradientTape from the same inputs and output
# gradient, to 1e-5 relative. Needs the venv of the conformance.venv fixture
# (tests/cmake/conformance.cmake).
set(tape_ops_conf_dir ${CMAKE_CURRENT_SOURCE_DIR}/conformance)
add_executable(tape_ops_cases ${tape_ops_conf_dir}/tape_ops_cases.c)
target_link_libraries(tape_ops_cases PRIVATE dist_internal)
target_compile_options(tape_ops_cases PRIVATE ${DIST_WARNINGS})

add_test(NAME conformance.tape_ops
         COMMAND ${DIST_CONF_VENV}/bin/python ${tape_ops_conf_dir}/tape_ops_conformance.py
                 $<TARGET_FILE:tape_ops_cases> ${CMAKE_CURRENT_BINARY_DIR}/tape_ops_conformance)
set_tests_properties(conformance.tape_ops PROPERTIES FIXTURES_REQUIRED tf_venv LABELS conformance
                     TIMEOUT 600 ENVIRONMENT "TF_CPP_MIN_LOG_LEVEL=2")
