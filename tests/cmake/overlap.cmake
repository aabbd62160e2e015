# distrain --overlap-gradients / --bytes-per-pack / --gradient-compression (issue #40): mirrored
# and multi_worker train with them and say what the overlap hid; other kinds refuse them.
set(expect ${CMAKE_CURRENT_SOURCE_DIR}/cli/expect.sh)

# 30 steps on 2 CPU replicas: the chief's summary line counts the 29 steps after the first.
add_test(NAME distrain.overlap_gradients_mirrored
         COMMAND ${expect} 0 "overlap_gradients: replica 0: 29 backward passes in 58 buckets"
                 $<TARGET_FILE:distrain> --strategy mirrored --devices cpu:0,cpu:1 --threads 1
                 --epochs 1 --steps-per-epoch 30 --overlap-gradients)
# Two local workers over TCP, 8 KiB buckets (3 per step), bfloat16 on the wire.
add_test(NAME distrain.overlap_gradients_multi_worker_bf16
         COMMAND ${expect} 0 "overlap_gradients: replica 0: 29 backward passes in 87 buckets of up to 8192 bytes"
                 $<TARGET_FILE:distrain> --strategy multi_worker --workers 2 --threads 1
                 --transport tcp --epochs 1 --steps-per-epoch 30 --overlap-gradients
                 --bytes-per-pack 8192 --gradient-compression bf16)
add_test(NAME distrain.overlap_gradients_refused_by_one_device
         COMMAND ${expect} 2 "--overlap-gradients applies to --strategy mirrored and multi_worker only"
                 $<TARGET_FILE:distrain> --strategy one_device --overlap-gradients)
add_test(NAME distrain.gradient_compression_refused_by_parameter_server
         COMMAND ${expect} 2 "--gradient-compression applies to --strategy mirrored and multi_worker only"
                 $<TARGET_FILE:distrain> --strategy parameter_server --gradient-compression bf16)
add_test(NAME distrain.gradient_compression_bad_value
         COMMAND ${expect} 2 "expected none, bf16 or fp16"
                 $<TARGET_FILE:distrain> --gradient-compression fp8)
set_tests_properties(distrain.overlap_gradients_mirrored distrain.overlap_gradients_multi_worker_bf16
                     distrain.overlap_gradients_refused_by_one_device
                     distrain.gradient_compression_refused_by_parameter_server
                     distrain.gradient_compression_bad_value
                     PROPERTIES LABELS cli TIMEOUT 300)
