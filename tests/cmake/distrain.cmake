# distrain end to end: accuracy on the embedded MNIST subset, and one-line errors with the
# documented exit codes for bad input.
set(expect ${CMAKE_CURRENT_SOURCE_DIR}/cli/expect.sh)
set(bad_dir ${CMAKE_CURRENT_BINARY_DIR}/bad_idx)

add_test(NAME distrain.fixtures
         COMMAND ${CMAKE_CURRENT_SOURCE_DIR}/cli/make_bad_idx.sh ${PROJECT_SOURCE_DIR}/src/data/mnist_subset ${bad_dir})
set_tests_properties(distrain.fixtures PROPERTIES FIXTURES_SETUP bad_idx LABELS cli)

function(distrain_error_test name rc text)
  add_test(NAME distrain.${name} COMMAND ${expect} ${rc} ${text} $<TARGET_FILE:distrain> ${ARGN})
  set_tests_properties(distrain.${name} PROPERTIES LABELS cli FIXTURES_REQUIRED bad_idx TIMEOUT 60)
endfunction()

distrain_error_test(missing_data_dir 1 "/nonexistent/mnist" --data-dir /nonexistent/mnist --quiet)
distrain_error_test(truncated_idx 1 "header promises 6268864 bytes of data, file has 99984" --data-dir ${bad_dir}/truncated --quiet)
distrain_error_test(wrong_magic 1 "bad magic 12 34 08 03" --data-dir ${bad_dir}/wrongheader --quiet)
distrain_error_test(batch_size_zero 2 "--batch-size" --batch-size 0)
distrain_error_test(unknown_strategy 2 "unknown strategy 'fancy'" --strategy fancy)
distrain_error_test(unknown_flag 2 "--frobnicate" --frobnicate 3)
# --devices gpu:0 on a machine without a GPU (skipped where nvidia-smi sees one)
add_test(NAME distrain.gpu_without_gpu
         COMMAND sh -c "if nvidia-smi -L >/dev/null 2>&1; then exit 77; fi; exec \"$0\" \"$@\""
                 ${expect} 2 "distrain: gpu:0: " $<TARGET_FILE:distrain> --devices gpu:0)
set_tests_properties(distrain.gpu_without_gpu PROPERTIES LABELS cli SKIP_RETURN_CODE 77 TIMEOUT 60)
distrain_error_test(gpu_that_does_not_exist 2 "gpu:64" --devices gpu:64)
distrain_error_test(device_twice 2 "listed twice" --devices cpu:0,cpu:0)
# TensorFlow's device names (tf.DeviceSpec's forms) name the same devices; the job and task are
# accepted and not used; partial or malformed names are usage errors naming the part
distrain_error_test(device_twice_tf_names 2 "listed twice" --devices /CPU:0,cpu:0)
distrain_error_test(device_without_index 2 "'/device:GPU:*': index '*'" --devices /device:GPU:*)
distrain_error_test(device_unknown_part 2 "unknown part 'host:0'" --devices /host:0/cpu:0)
add_test(NAME distrain.devices_tensorflow_names
         COMMAND ${expect} 0 "Strategy: mirrored, 2 replica(s) [cpu:0, cpu:1]" $<TARGET_FILE:distrain>
                 --devices /job:worker/task:0/device:CPU:0,/cpu:1 --threads 1 --epochs 1
                 --steps-per-epoch 1)
set_tests_properties(distrain.devices_tensorflow_names PROPERTIES LABELS cli TIMEOUT 120)
# --lr-schedule and clipping: Keras's messages for bad schedules, its one-clip rule, and a short
# mirrored run with both (each replica clips the all-reduced gradients alike)
distrain_error_test(lr_schedule_decay_steps_zero 2 "Argument `decay_steps` must be > 0"
                    --lr-schedule exponential_decay:initial_learning_rate=0.1,decay_steps=0,decay_rate=0.5)
distrain_error_test(lr_schedule_unknown_key 2 "exponential_decay takes no argument 'power'"
                    --lr-schedule exponential_decay:decay_steps=10,decay_rate=0.5,power=2)
distrain_error_test(lr_schedule_with_reduce_lr 2 "--reduce-lr-patience cannot reduce a --lr-schedule"
                    --lr-schedule cosine_decay:initial_learning_rate=0.1,decay_steps=10 --reduce-lr-patience 2)
distrain_error_test(two_clippings 2 "only one of --clipnorm, --clipvalue and --global-clipnorm"
                    --clipnorm 1 --global-clipnorm 2)
distrain_error_test(clipping_under_parameter_server 2 "not supported with --strategy parameter_server"
                    --strategy parameter_server --clipvalue 1)
add_test(NAME distrain.lr_schedule_and_clipnorm
         COMMAND ${expect} 0 "Test loss" $<TARGET_FILE:distrain> --strategy mirrored
                 --devices cpu:0,cpu:1 --threads 1 --epochs 2 --steps-per-epoch 5 --optimizer sgd
                 --lr-schedule cosine_decay:initial_learning_rate=0.1,decay_steps=8 --clipnorm 1)
set_tests_properties(distrain.lr_schedule_and_clipnorm PROPERTIES LABELS cli TIMEOUT 120)

# The seed's acceptance runs: defaults (5 epochs, batch 64, Adam 0.001) reach >= 0.95.
foreach(strategy one_device mirrored)
  add_test(NAME distrain.accuracy_${strategy}
           COMMAND ${CMAKE_COMMAND} -DDISTRAIN=$<TARGET_FILE:distrain> -DSTRATEGY=${strategy}
                   -DOUT=${CMAKE_CURRENT_BINARY_DIR}/metrics_${strategy}.json
                   -P ${CMAKE_CURRENT_SOURCE_DIR}/cli/accuracy.cmake)
  set_tests_properties(distrain.accuracy_${strategy} PROPERTIES LABELS "cli;slow" TIMEOUT 600)
endforeach()

# --data-format jpeg-folder on MNIST digits written as JPEG class folders by a fixture tool.
add_executable(make_jpeg_mnist ${CMAKE_CURRENT_SOURCE_DIR}/cli/make_jpeg_mnist.c)
target_link_libraries(make_jpeg_mnist PRIVATE dist PkgConfig::TURBOJPEG)
set(jpeg_dir ${CMAKE_CURRENT_BINARY_DIR}/jpeg_mnist)
# made anew each run: files of an earlier run (another data order) would be read too
add_test(NAME distrain.jpeg_fixtures
         COMMAND sh -c "rm -rf '${jpeg_dir}' && '$<TARGET_FILE:make_jpeg_mnist>' '${jpeg_dir}' 400 100")
set_tests_properties(distrain.jpeg_fixtures PROPERTIES FIXTURES_SETUP jpeg_mnist LABELS cli)
add_test(NAME distrain.jpeg_folder
         COMMAND ${CMAKE_COMMAND} -DDISTRAIN=$<TARGET_FILE:distrain>
                 "-DARGS=--data-format;jpeg-folder;--data-dir;${jpeg_dir};--epochs;3"
                 -DOUT=${CMAKE_CURRENT_BINARY_DIR}/metrics_jpeg.json -DMIN_ACCURACY=0.85 -DSTEPS=189
                 -P ${CMAKE_CURRENT_SOURCE_DIR}/cli/accuracy.cmake)
set_tests_properties(distrain.jpeg_folder PROPERTIES LABELS cli FIXTURES_REQUIRED jpeg_mnist TIMEOUT 300)
distrain_error_test(jpeg_folder_without_data_dir 2 "--data-dir" --data-format jpeg-folder)

# Fashion-MNIST from Debian's dataset-fashion-mnist package (installed by tools/setup-deps.sh).
add_test(NAME distrain.fashion_mnist
         COMMAND ${CMAKE_COMMAND} -DDISTRAIN=$<TARGET_FILE:distrain>
                 "-DARGS=--dataset;fashion_mnist;--epochs;1;--steps-per-epoch;150"
                 -DOUT=${CMAKE_CURRENT_BINARY_DIR}/metrics_fashion.json -DMIN_ACCURACY=0.6 -DSTEPS=150
                 -P ${CMAKE_CURRENT_SOURCE_DIR}/cli/accuracy.cmake)
set_tests_properties(distrain.fashion_mnist PROPERTIES LABELS cli TIMEOUT 300)

# --print-cluster: TF_CONFIG resolved with TensorFlow's numbering, or TF's message and exit 2.
add_test(NAME distrain.print_cluster
         COMMAND ${expect} 0 "\"id_in_cluster\":2" env
                 [[TF_CONFIG={"cluster":{"chief":["h:1"],"worker":["h:2","h:3"],"ps":["h:4"]},"task":{"type":"worker","index":1}}]]
                 $<TARGET_FILE:distrain> --print-cluster)
add_test(NAME distrain.print_cluster_invalid
         COMMAND ${expect} 2 "exceeds the maximum id of worker" env
                 [[TF_CONFIG={"cluster":{"worker":["h:2","h:3"]},"task":{"type":"worker","index":2}}]]
                 $<TARGET_FILE:distrain> --print-cluster)
set_tests_properties(distrain.print_cluster distrain.print_cluster_invalid PROPERTIES LABELS cli TIMEOUT 60)

# --validation-split on the embedded subset: the held-out last 10% holds every digit.
add_test(NAME distrain.validation_split
         COMMAND ${CMAKE_CURRENT_SOURCE_DIR}/cli/validation_split.sh $<TARGET_FILE:distrain>
                 ${CMAKE_CURRENT_BINARY_DIR}/validation_split)
set_tests_properties(distrain.validation_split PROPERTIES LABELS cli TIMEOUT 300)

# Keras's defaults: EarlyStopping's restore_best_weights off, ReduceLROnPlateau's factor 0.1
# (pinned by conformance.distrain_logs); the flags that set them need their callbacks.
add_test(NAME distrain.keras_callback_defaults
         COMMAND ${CMAKE_CURRENT_SOURCE_DIR}/cli/keras_defaults.sh $<TARGET_FILE:distrain>
                 ${CMAKE_CURRENT_BINARY_DIR}/keras_defaults)
set_tests_properties(distrain.keras_callback_defaults PROPERTIES LABELS cli TIMEOUT 300)
distrain_error_test(restore_best_weights_without_early_stopping 2 "needs --early-stopping-patience"
                    --restore-best-weights)
distrain_error_test(reduce_lr_factor_without_patience 2 "needs --reduce-lr-patience"
                    --reduce-lr-factor 0.5)
distrain_error_test(histogram_freq_without_logdir 2 "--histogram-freq and --update-freq need --logdir"
                    --histogram-freq 1)
distrain_error_test(update_freq_without_logdir 2 "--histogram-freq and --update-freq need --logdir"
                    --update-freq batch)
distrain_error_test(update_freq_zero 2 "invalid value '0' for --update-freq"
                    --logdir ${CMAKE_CURRENT_BINARY_DIR}/unused_logs --update-freq 0)
distrain_error_test(update_freq_word 2 "invalid value 'often' for --update-freq"
                    --logdir ${CMAKE_CURRENT_BINARY_DIR}/unused_logs --update-freq often)
distrain_error_test(reduce_lr_factor_out_of_range 2 "between 0 and 1" --reduce-lr-factor 1
                    --reduce-lr-patience 1)

# Weights in and out: --load-weights with --epochs 0 reproduces the test metrics of the run that
# saved them (safetensors and Keras .weights.h5), and distrain predict on the JPEG test folder
# agrees with the --epochs 0 evaluation of the same images.
foreach(format safetensors weights.h5)
  string(REPLACE "." "_" tag ${format})
  add_test(NAME distrain.load_weights_${tag}
           COMMAND ${CMAKE_COMMAND} -DDISTRAIN=$<TARGET_FILE:distrain>
                   -DWORK=${CMAKE_CURRENT_BINARY_DIR}/load_weights_${tag} -DWEIGHTS=w.${format}
                   -P ${CMAKE_CURRENT_SOURCE_DIR}/cli/load_weights.cmake)
  set_tests_properties(distrain.load_weights_${tag} PROPERTIES LABELS cli TIMEOUT 120)
endforeach()
# Every worker of a multi_worker cluster loads the file; under parameter_server the chief's load
# sets the variables on the ps task.
add_test(NAME distrain.load_weights_multi_worker
         COMMAND ${CMAKE_COMMAND} -DDISTRAIN=$<TARGET_FILE:distrain>
                 -DWORK=${CMAKE_CURRENT_BINARY_DIR}/load_weights_multi_worker -DWEIGHTS=w.safetensors
                 "-DEVAL_ARGS=--strategy;multi_worker;--workers;2"
                 -P ${CMAKE_CURRENT_SOURCE_DIR}/cli/load_weights.cmake)
add_test(NAME distrain.load_weights_parameter_server
         COMMAND ${CMAKE_COMMAND} -DDISTRAIN=$<TARGET_FILE:distrain>
                 -DWORK=${CMAKE_CURRENT_BINARY_DIR}/load_weights_parameter_server
                 -DWEIGHTS=w.weights.h5 "-DEVAL_ARGS=--strategy;parameter_server;--workers;1;--ps;1"
                 -P ${CMAKE_CURRENT_SOURCE_DIR}/cli/load_weights.cmake)
set_tests_properties(distrain.load_weights_multi_worker distrain.load_weights_parameter_server
                     PROPERTIES LABELS cli TIMEOUT 180)
set_tests_properties(distrain.load_weights_parameter_server PROPERTIES RESOURCE_LOCK loopback_ps_ports)
add_test(NAME distrain.predict_jpeg_folder
         COMMAND ${CMAKE_COMMAND} -DDISTRAIN=$<TARGET_FILE:distrain>
                 -DWORK=${CMAKE_CURRENT_BINARY_DIR}/predict_jpeg -DJPEG=${jpeg_dir}
                 -P ${CMAKE_CURRENT_SOURCE_DIR}/cli/predict_jpeg.cmake)
set_tests_properties(distrain.predict_jpeg_folder PROPERTIES LABELS cli FIXTURES_REQUIRED jpeg_mnist
                     TIMEOUT 120)
add_test(NAME distrain.predict_inputs
         COMMAND ${CMAKE_COMMAND} -DDISTRAIN=$<TARGET_FILE:distrain>
                 -DWORK=${CMAKE_CURRENT_BINARY_DIR}/predict_inputs -DJPEG=${jpeg_dir}
                 -DIDX=${PROJECT_SOURCE_DIR}/src/data/mnist_subset/t10k-images-idx3-ubyte.gz
                 -P ${CMAKE_CURRENT_SOURCE_DIR}/cli/predict_inputs.cmake)
set_tests_properties(distrain.predict_inputs PROPERTIES LABELS cli FIXTURES_REQUIRED jpeg_mnist
                     TIMEOUT 120)
distrain_error_test(epochs_0_with_csv_log 2 "--csv-log does nothing with --epochs 0" --epochs 0
                    --csv-log x.csv)
distrain_error_test(load_weights_missing 1 "/nonexistent/w.safetensors" --epochs 0
                    --load-weights /nonexistent/w.safetensors --quiet)
distrain_error_test(predict_without_input 2 "--input is required" predict --weights w.safetensors)
