# Conformance of the TFRecord reader and the tf.train.Example parser against TensorFlow: files
# written by tf.io.TFRecordWriter (none, GZIP, ZLIB), values from tf.io.parse_single_example
# against dist_dataset_from_tfrecord + dist_dataset_parse_example, bit for bit, and the offsets of
# TF's DataLossError on damaged copies. Needs the venv of the conformance.venv fixture
# (tests/cmake/conformance.cmake).
set(tfrecord_conf_dir ${CMAKE_CURRENT_SOURCE_DIR}/conformance)
add_executable(tfrecord_conformance ${tfrecord_conf_dir}/tfrecord_conformance.c)
target_link_libraries(tfrecord_conformance PRIVATE dist_internal)
target_compile_options(tfrecord_conformance PRIVATE ${DIST_WARNINGS})

add_test(NAME conformance.tfrecord
         COMMAND ${DIST_CONF_VENV}/bin/python ${tfrecord_conf_dir}/tfrecord_conformance.py
                 $<TARGET_FILE:tfrecord_conformance> ${CMAKE_CURRENT_BINARY_DIR}/tfrecord_conformance_files)
set_tests_properties(conformance.tfrecord PROPERTIES FIXTURES_REQUIRED tf_venv LABELS conformance
                     TIMEOUT 600 ENVIRONMENT "TF_CPP_MIN_LOG_LEVEL=2")

# Real data: TensorFlow writes the embedded MNIST subset as 4 shards (GZIP and uncompressed, PNG
# and raw images, int64 labels, a VarLenFeature); tf.data and libdist read them to the same
# tensors in the same order, one file after the other, with parallel reads and per worker under
# FILE auto-sharding.
add_executable(tfrecord_mnist_conformance ${tfrecord_conf_dir}/tfrecord_mnist_conformance.c)
target_link_libraries(tfrecord_mnist_conformance PRIVATE dist_internal)
target_compile_options(tfrecord_mnist_conformance PRIVATE ${DIST_WARNINGS})
add_test(NAME conformance.tfrecord_mnist
         COMMAND ${DIST_CONF_VENV}/bin/python ${tfrecord_conf_dir}/tfrecord_mnist_conformance.py
                 $<TARGET_FILE:tfrecord_mnist_conformance> ${PROJECT_SOURCE_DIR}/src/data/mnist_subset
                 ${CMAKE_CURRENT_BINARY_DIR}/tfrecord_mnist_conformance_files)
set_tests_properties(conformance.tfrecord_mnist PROPERTIES FIXTURES_REQUIRED tf_venv LABELS conformance
                     TIMEOUT 900 ENVIRONMENT "TF_CPP_MIN_LOG_LEVEL=2")
