# Conformance of loss scaling against Keras itself: tf-keras's and Keras 3's LossScaleOptimizer
# versus dist_loss_scale_optimizer, through the same finite/Inf/NaN steps, compared after every
# step (scale, counter, applied). Needs the venv of the conformance.venv fixture
# (tests/cmake/conformance.cmake), which ships tensorflow-cpu, tf-keras and Keras 3.
set(ls_conf_dir ${CMAKE_CURRENT_SOURCE_DIR}/conformance)
add_executable(loss_scale_trace ${ls_conf_dir}/loss_scale_trace.c)
target_link_libraries(loss_scale_trace PRIVATE dist_internal)
target_compile_options(loss_scale_trace PRIVATE ${DIST_WARNINGS})


add_test(NAME conformance.loss_scale
         COMMAND ${DIST_CONF_VENV}/bin/python ${ls_conf_dir}/loss_scale_run.py ${DIST_CONF_VENV}/bin/python
                 $<TARGET_FILE:loss_scale_trace> ${ls_conf_dir}/loss_scale_cases.json)
set_tests_properties(conformance.loss_scale PROPERTIES FIXTURES_REQUIRED tf_venv
                     LABELS conformance TIMEOUT 600)
