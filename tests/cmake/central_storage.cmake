# distrain --strategy central_storage (TF's CentralStorageStrategy): it trains, its header and
# metrics name it and where the variables live, it resumes from a backup and loads weights, and
# the combinations TensorFlow or distrain refuse are one-line usage errors.
set(expect ${CMAKE_CURRENT_SOURCE_DIR}/cli/expect.sh)

# Two epochs of the embedded subset (250 steps) on 2 CPU replicas reach 0.9.
add_test(NAME distrain.central_storage_trains
         COMMAND ${CMAKE_COMMAND} -DDISTRAIN=$<TARGET_FILE:distrain> -DSTRATEGY=central_storage
                 "-DARGS=--devices;cpu:0,cpu:1;--threads;1;--epochs;2"
                 -DOUT=${CMAKE_CURRENT_BINARY_DIR}/metrics_central_storage.json -DMIN_ACCURACY=0.9
                 -DSTEPS=250 -P ${CMAKE_CURRENT_SOURCE_DIR}/cli/accuracy.cmake)
add_test(NAME distrain.central_storage_header
         COMMAND ${expect} 0
                 "Strategy: central_storage, 2 replica(s) [cpu:0, cpu:1], in-process onto cpu:0 reduction"
                 $<TARGET_FILE:distrain> --strategy central_storage --devices cpu:0,cpu:1
                 --threads 1 --epochs 1 --steps-per-epoch 3)
add_test(NAME distrain.central_storage_in_version
         COMMAND ${expect} 0 "tpu, central_storage" $<TARGET_FILE:distrain> --version)
add_test(NAME distrain.central_storage_in_help
         COMMAND ${expect} 0 "--strategy one_device|mirrored|multi_worker|parameter_server|tpu|central_storage"
                 $<TARGET_FILE:distrain> --help)
# A backup taken under it resumes to the uninterrupted run's weights, byte for byte (the
# optimizer's slots live on the central replica only).
add_test(NAME distrain.central_storage_backup_resume
         COMMAND ${CMAKE_CURRENT_SOURCE_DIR}/cli/backup_resume.sh $<TARGET_FILE:distrain>
                 ${CMAKE_CURRENT_BINARY_DIR}/backup_resume_central_storage central_storage)
# Weights saved under mirrored evaluate the same under central_storage.
add_test(NAME distrain.load_weights_central_storage
         COMMAND ${CMAKE_COMMAND} -DDISTRAIN=$<TARGET_FILE:distrain>
                 -DWORK=${CMAKE_CURRENT_BINARY_DIR}/load_weights_central_storage
                 -DWEIGHTS=w.safetensors "-DEVAL_ARGS=--strategy;central_storage;--devices;cpu:0,cpu:1"
                 -P ${CMAKE_CURRENT_SOURCE_DIR}/cli/load_weights.cmake)
set_tests_properties(distrain.central_storage_trains distrain.central_storage_header
                     distrain.central_storage_in_version distrain.central_storage_in_help
                     distrain.central_storage_backup_resume distrain.load_weights_central_storage
                     PROPERTIES LABELS cli TIMEOUT 300)

# One-line refusals: TF's LossScaleOptimizer refuses CentralStorageStrategy; it is a one-machine
# strategy, so distrain's cluster flags do not apply to it.
function(central_storage_error name text)
  add_test(NAME distrain.central_storage_${name}
           COMMAND ${expect} 2 ${text} $<TARGET_FILE:distrain> --strategy central_storage ${ARGN})
  set_tests_properties(distrain.central_storage_${name} PROPERTIES LABELS cli TIMEOUT 60)
endfunction()
central_storage_error(refuses_fp16 "loss scaling (--loss-scale, --mixed-precision fp16) is not supported with it, as in TensorFlow"
                      --mixed-precision fp16)
central_storage_error(refuses_loss_scale "is not supported with it, as in TensorFlow" --loss-scale dynamic)
central_storage_error(refuses_workers "--workers needs --strategy multi_worker or parameter_server"
                      --workers 2)
central_storage_error(refuses_ps "--ps needs --strategy parameter_server and --workers" --ps 1)
central_storage_error(refuses_transport "--transport applies to --strategy multi_worker" --transport tcp)
central_storage_error(refuses_tpu_flags "--pjrt-plugin, --tpu and --tpu-cores apply to --strategy tpu only"
                      --tpu-cores 2)
add_test(NAME distrain.unknown_strategy_lists_central_storage
         COMMAND ${expect} 2
                 "unknown strategy 'centralstorage' (the strategies: one_device, mirrored, multi_worker, parameter_server, tpu, central_storage)"
                 $<TARGET_FILE:distrain> --strategy centralstorage)
set_tests_properties(distrain.unknown_strategy_lists_central_storage PROPERTIES LABELS cli TIMEOUT 60)
