# Issue #35's accuracy must-shows (LABELS conformance; need the venv fixture of
# conformance.cmake). conformance.resnet_accuracy: a Keras Functional ResNet
# (tests/data/keras3_resnet_accuracy.json) trained 5 epochs by distrain --model reaches Keras
# fit's test accuracy on the embedded MNIST subset within 0.01, from the same initial weights
# and on the same batches. 10.5 to 12.5 minutes on two cores shared with four other jobs
# (distrain's training nearly all of it). conformance.transformer_accuracy: the zoo Transformer (bench/models/zoo.py), trained by
# libdist through the C API (text_accuracy.c: distrain feeds images only), reaches >= 0.95 test
# accuracy on a synthetic token task, with Keras on the same data as the reference. 11.5 to 15
# minutes on two cores shared with four other jobs (load average 7-9), most of it libdist's
# training (3 epochs of 2,048 sequences).
add_test(NAME conformance.resnet_accuracy
         COMMAND ${DIST_CONF_VENV}/bin/python ${CMAKE_CURRENT_SOURCE_DIR}/conformance/resnet_accuracy.py
                 $<TARGET_FILE:distrain> ${CMAKE_CURRENT_SOURCE_DIR}/data/keras3_resnet_accuracy.json
                 ${PROJECT_SOURCE_DIR}/src/data/mnist_subset
                 ${CMAKE_CURRENT_BINARY_DIR}/resnet_accuracy_work)
set_tests_properties(conformance.resnet_accuracy PROPERTIES FIXTURES_REQUIRED tf_venv
                     LABELS conformance TIMEOUT 1800)

add_executable(text_accuracy ${CMAKE_CURRENT_SOURCE_DIR}/conformance/text_accuracy.c)
target_link_libraries(text_accuracy PRIVATE dist_internal)
target_compile_options(text_accuracy PRIVATE ${DIST_WARNINGS})
add_test(NAME conformance.transformer_accuracy
         COMMAND ${DIST_CONF_VENV}/bin/python ${CMAKE_CURRENT_SOURCE_DIR}/conformance/text_accuracy.py
                 $<TARGET_FILE:text_accuracy> ${PROJECT_SOURCE_DIR}/bench/models
                 ${CMAKE_CURRENT_BINARY_DIR}/transformer_accuracy_work)
set_tests_properties(conformance.transformer_accuracy PROPERTIES FIXTURES_REQUIRED tf_venv
                     LABELS conformance TIMEOUT 1800)
