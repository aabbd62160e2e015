# Issue #22, "What a user hits": one test per behaviour, each failing before its fix.
set(expect_sh ${CMAKE_CURRENT_SOURCE_DIR}/cli/expect.sh)
function(i22_test name rc text)
  add_test(NAME distrain.i22.${name} COMMAND ${expect_sh} ${rc} ${text} $<TARGET_FILE:distrain> ${ARGN})
  set_tests_properties(distrain.i22.${name} PROPERTIES LABELS cli TIMEOUT 120)
endfunction()

# 1 (JPEG class lists), 3 (EarlyStopping's and ReduceLROnPlateau's state across a kill and a
# resume), 5 (empty sets), 4 and 15 (--csv-log across a resume, the metrics'
# counts; epochs after early stopping; null train metrics when nothing trained), 6 (a corrupt test JPEG found up front; weights rescued
# from a late write failure):
# parts of one script.
# Messages that named another problem than the real one: a truncated JPEG, an empty
# .weights.h5 (and .safetensors), PNG bytes in a .jpg given to distrain predict.
foreach(part jpeg_classes empty_sets csv_resume corrupt_test_jpeg late_write early_stop_epochs
             nothing_trained callbacks_resume truncated_test_jpeg empty_keras_weights
             png_named_jpg_predict)
  add_test(NAME distrain.i22.${part}
           COMMAND ${CMAKE_CURRENT_SOURCE_DIR}/cli/user_issues.sh $<TARGET_FILE:distrain>
                   ${CMAKE_CURRENT_BINARY_DIR}/jpeg_mnist ${PROJECT_SOURCE_DIR}/src/data/mnist_subset
                   ${CMAKE_CURRENT_BINARY_DIR}/user_issues ${part})
  set_tests_properties(distrain.i22.${part} PROPERTIES LABELS cli TIMEOUT 600
                       FIXTURES_REQUIRED jpeg_mnist)
endforeach()

# 6. Output paths are checked before the first step (exit 2, naming the flag).
i22_test(save_weights_unwritable 2 "--save-weights" --save-weights /nonexistent/w.st)
i22_test(metrics_json_unwritable 2 "--metrics-json" --metrics-json /nonexistent/m.json)
i22_test(trace_unwritable 2 "--trace" --trace /nonexistent/t.json)
i22_test(csv_log_unwritable 2 "--csv-log" --csv-log /nonexistent/l.csv)
i22_test(checkpoint_dir_is_a_file 2 "--checkpoint-dir" --checkpoint-dir ${CMAKE_CURRENT_SOURCE_DIR}/CMakeLists.txt)
# 7. A directory option is not a filename template.
i22_test(checkpoint_dir_is_not_a_template 2 "not a template" --checkpoint-dir ck_{epoch})
# 8. Exit codes and --version / --help.
i22_test(unknown_flag_at_the_end 2 "unknown option '--frobnicate'" --frobnicate)
i22_test(flag_without_value_given_one 2 "--quiet takes no value" --quiet=yes)
i22_test(version 0 "CPU ISA in use" --version)
i22_test(help_lists_defaults 0 "stalls N epochs (default: no early stopping)" --help)
add_test(NAME distrain.i22.tf_config_not_json
         COMMAND ${CMAKE_COMMAND} -E env "TF_CONFIG=not json"
                 ${expect_sh} 2 "distrain: TF_CONFIG: " $<TARGET_FILE:distrain> --strategy multi_worker)
# 14. An evaluator task is never trained as a chief: it evaluates the training's checkpoints
# (tests/cmake/evaluator.cmake), and without --checkpoint-dir it is a usage error.
add_test(NAME distrain.i22.evaluator_refused
         COMMAND ${CMAKE_COMMAND} -E env
                 "TF_CONFIG={\"cluster\":{\"worker\":[\"localhost:1\"],\"evaluator\":[\"localhost:2\"]},\"task\":{\"type\":\"evaluator\",\"index\":0}}"
                 ${expect_sh} 2 "--task evaluator needs --checkpoint-dir" $<TARGET_FILE:distrain>
                 --strategy multi_worker)
set_tests_properties(distrain.i22.tf_config_not_json distrain.i22.evaluator_refused
                     PROPERTIES LABELS cli TIMEOUT 60)
# 10. Flags that would do nothing.
i22_test(backup_freq_without_backup_dir 2 "--backup-freq needs --backup-dir" --backup-freq 5)
i22_test(transport_without_multi_worker 2 "--transport applies to --strategy multi_worker" --transport tcp)
i22_test(connect_timeout_without_multi_worker 2 "--connect-timeout applies" --connect-timeout 5)
i22_test(dataset_with_jpeg_folder 2 "--dataset does not apply" --data-format jpeg-folder --data-dir x --dataset mnist)
# 16. TensorFlow's device names; loose forms refused.
i22_test(device_tf_names 0 "Test loss" --devices /device:CPU:0 --strategy one_device --epochs 1
         --steps-per-epoch 2 --threads 1)
i22_test(device_without_index 2 "distrain: --devices: device 'cpu'" --devices cpu)
i22_test(device_trailing_comma 2 "empty entry" --devices cpu:0,)
i22_test(device_empty_entry 2 "empty entry" --devices cpu:1,,cpu:0)
# 2. Under multi_worker only the chief writes; another worker writes only its own trace.
add_test(NAME distrain.i22.multi_worker_outputs
         COMMAND ${CMAKE_CURRENT_SOURCE_DIR}/cli/mw_outputs.sh $<TARGET_FILE:distrain>
                 ${CMAKE_CURRENT_BINARY_DIR}/mw_outputs)
set_tests_properties(distrain.i22.multi_worker_outputs PROPERTIES LABELS cli TIMEOUT 300 RUN_SERIAL TRUE)
# 9. The check-numerics message names the replica once.
i22_test(check_numerics_names_the_replica_once 1 "training: replica 0: check numerics: layer"
         --check-numerics --mixed-precision fp16 --loss-scale 1e30 --strategy one_device
         --devices cpu:0 --threads 1 --epochs 1 --steps-per-epoch 3 --quiet)
# 17. --check-numerics does not stop on the overflows that dynamic loss scaling skips.
i22_test(check_numerics_with_dynamic_loss_scale 0 "Test loss" --check-numerics --mixed-precision fp16
         --loss-scale dynamic:1e30 --strategy one_device --devices cpu:0 --threads 1 --epochs 1
         --steps-per-epoch 3)
# 10. A non-default loss scale is shown in the header; --threads above the cores warns.
i22_test(loss_scale_in_header 0 "Loss scale: fixed 128" --loss-scale 128 --strategy one_device
         --devices cpu:0 --threads 1 --epochs 1 --steps-per-epoch 2)
i22_test(threads_above_cores_warns 0 "distrain: warning: --threads 1024 is more than" --threads 1024
         --strategy one_device --devices cpu:0 --epochs 1 --steps-per-epoch 1 --quiet)
# 11. Workers started by hand on one host divide its cores and say so.
add_test(NAME distrain.i22.multi_worker_share_host
         COMMAND ${CMAKE_CURRENT_SOURCE_DIR}/cli/mw_outputs.sh $<TARGET_FILE:distrain>
                 ${CMAKE_CURRENT_BINARY_DIR}/mw_share_host share_host)
set_tests_properties(distrain.i22.multi_worker_share_host PROPERTIES LABELS cli TIMEOUT 300 RUN_SERIAL TRUE)
# 12. Workers started with different settings refuse before training, naming the setting.
add_test(NAME distrain.i22.multi_worker_settings_mismatch
         COMMAND ${CMAKE_CURRENT_SOURCE_DIR}/cli/mw_outputs.sh $<TARGET_FILE:distrain>
                 ${CMAKE_CURRENT_BINARY_DIR}/mw_mismatch mismatch)
set_tests_properties(distrain.i22.multi_worker_settings_mismatch PROPERTIES LABELS cli TIMEOUT 300 RUN_SERIAL TRUE)
# 15. The batch buffer is sized by min(batch, dataset size): --batch-size 1048576 on the
# 400-image JPEG set runs in 3 GB of address space (before: "batch: cannot allocate 3288334336
# bytes"). Skipped under AddressSanitizer, whose shadow memory needs more address space.
add_test(NAME distrain.i22.batch_buffer_by_dataset_size
         COMMAND sh -c "if ldd \"$1\" | grep -q libasan; then exit 77; fi; ulimit -v 3000000; shift; exec \"$@\""
                 sh $<TARGET_FILE:distrain> ${expect_sh} 0 "Test loss" $<TARGET_FILE:distrain>
                 --data-format jpeg-folder --data-dir ${CMAKE_CURRENT_BINARY_DIR}/jpeg_mnist
                 --strategy one_device --devices cpu:0 --threads 1 --epochs 1 --batch-size 1048576)
set_tests_properties(distrain.i22.batch_buffer_by_dataset_size PROPERTIES LABELS cli TIMEOUT 300
                     SKIP_RETURN_CODE 77 FIXTURES_REQUIRED jpeg_mnist)
