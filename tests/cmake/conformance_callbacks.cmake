# Conformance of the fit callbacks against Keras itself: tf-keras's EarlyStopping and
# ReduceLROnPlateau, fed the same metric sequences as ours, make the same decisions epoch by
# epoch (stop, stopped/best epoch, restored weights, learning rate). Needs the venv of the
# conformance.venv fixture (tests/cmake/conformance.cmake).
set(cb_conf_dir ${CMAKE_CURRENT_SOURCE_DIR}/conformance)
add_executable(callback_trace ${cb_conf_dir}/callback_trace.c)
target_link_libraries(callback_trace PRIVATE dist_internal)
target_compile_options(callback_trace PRIVATE ${DIST_WARNINGS})


add_test(NAME conformance.callbacks
         COMMAND ${DIST_CONF_VENV}/bin/python ${cb_conf_dir}/callback_conformance.py
                 $<TARGET_FILE:callback_trace> ${cb_conf_dir}/callback_cases.json)
set_tests_properties(conformance.callbacks PROPERTIES FIXTURES_REQUIRED tf_venv
                     LABELS conformance TIMEOUT 600 ENVIRONMENT "TF_CPP_MIN_LOG_LEVEL=2")

# distrain --logdir / --csv-log / --checkpoint-dir read by TensorBoard's EventAccumulator, the
# csv module and safetensors.numpy: the same per-epoch values everywhere.
add_test(NAME conformance.distrain_logs
         COMMAND ${DIST_CONF_VENV}/bin/python ${cb_conf_dir}/check_distrain_logs.py
                 $<TARGET_FILE:distrain>)
set_tests_properties(conformance.distrain_logs PROPERTIES FIXTURES_REQUIRED tf_venv
                     LABELS conformance TIMEOUT 600 ENVIRONMENT "TF_CPP_MIN_LOG_LEVEL=2")

# distrain --histogram-freq / --update-freq: weight histograms read by TensorBoard's
# EventAccumulator and equal to tf.summary.histogram's buckets of the saved weights; batch_loss
# and batch_accuracy at the global batch counts.
add_test(NAME conformance.tensorboard_histograms
         COMMAND ${DIST_CONF_VENV}/bin/python ${cb_conf_dir}/check_tensorboard_histograms.py
                 $<TARGET_FILE:distrain>)
set_tests_properties(conformance.tensorboard_histograms PROPERTIES FIXTURES_REQUIRED tf_venv
                     LABELS conformance TIMEOUT 600 ENVIRONMENT "TF_CPP_MIN_LOG_LEVEL=2")
