# Conformance of the variable partitioners against TensorFlow itself: each case of
# partitioner_cases.json is a variable created under a real ParameterServerStrategy (an
# in-process cluster on localhost) with tf.distribute.experimental.partitioners.*, versus
# dist_partitioner_num_shards and dist_partitioner_shard_rows: the shard count and every shard's
# rows, or both refusing. Needs the venv of the conformance.venv fixture
# (tests/cmake/conformance.cmake).
set(part_conf_dir ${CMAKE_CURRENT_SOURCE_DIR}/conformance)
add_executable(partitioner_cases ${part_conf_dir}/partitioner_cases.c)
target_link_libraries(partitioner_cases PRIVATE dist_internal PkgConfig::CJSON)
target_compile_options(partitioner_cases PRIVATE ${DIST_WARNINGS})

add_test(NAME conformance.partitioners
         COMMAND ${DIST_CONF_VENV}/bin/python ${part_conf_dir}/partitioner_run.py ${DIST_CONF_VENV}/bin/python
                 $<TARGET_FILE:partitioner_cases> ${part_conf_dir}/partitioner_cases.json)
set_tests_properties(conformance.partitioners PROPERTIES FIXTURES_REQUIRED tf_venv
                     LABELS conformance TIMEOUT 600 ENVIRONMENT "TF_CPP_MIN_LOG_LEVEL=2")
