# Conformance of mixed precision's rounding against TensorFlow: tf.cast to float16 / bfloat16
# and back versus dist_op_cast, bit for bit, on edge cases and 400,000 random values. Needs the
# venv of the conformance.venv fixture (tests/cmake/conformance.cmake).
set(round_conf_dir ${CMAKE_CURRENT_SOURCE_DIR}/conformance)
add_executable(round_cast ${round_conf_dir}/round_cast.c)
target_link_libraries(round_cast PRIVATE dist_internal)
target_compile_options(round_cast PRIVATE ${DIST_WARNINGS})


add_test(NAME conformance.round
         COMMAND ${DIST_CONF_VENV}/bin/python ${round_conf_dir}/round_conformance.py
                 $<TARGET_FILE:round_cast> ${CMAKE_CURRENT_BINARY_DIR}/round_conformance)
set_tests_properties(conformance.round PROPERTIES FIXTURES_REQUIRED tf_venv LABELS conformance
                     TIMEOUT 600 ENVIRONMENT "TF_CPP_MIN_LOG_LEVEL=2")
