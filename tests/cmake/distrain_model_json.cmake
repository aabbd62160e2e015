# distrain --model FILE.json: a Keras Functional model (tests/data/keras3_resnet_mnist.json: a
# residual block, BatchNormalization, a Dense(10, softmax) head) trains under mirrored and writes
# its .weights.h5 and .keras files, and a
# model distrain's data does not fit, or libdist cannot read, is a one-line usage error.
# Agreement of the training with Keras itself is conformance.keras_functional's.
set(mdir ${CMAKE_CURRENT_BINARY_DIR}/distrain_model_json)
file(MAKE_DIRECTORY ${mdir})
add_test(NAME distrain.model_functional_trains
         COMMAND ${expect} 0 "skip (Add)" $<TARGET_FILE:distrain>
                 --model ${CMAKE_CURRENT_SOURCE_DIR}/data/keras3_resnet_mnist.json
                 --strategy mirrored --devices cpu:0,cpu:1 --epochs 1 --batch-size 64
                 --save-weights ${mdir}/resnet.weights.h5 --save-model ${mdir}/resnet.keras)
set_tests_properties(distrain.model_functional_trains PROPERTIES LABELS cli TIMEOUT 300)

# (28, 28, 1) inputs but 3 outputs; and a channels_first Conv2D, which libdist refuses
set(seq_head "{\"class_name\":\"Sequential\",\"config\":{\"name\":\"s\",\"layers\":[{\"class_name\":\"InputLayer\",\"config\":{\"batch_shape\":[null,28,28,1],\"name\":\"in\"}}")
file(WRITE ${mdir}/three_outputs.json
     "${seq_head},{\"class_name\":\"Flatten\",\"config\":{\"name\":\"f\"}},{\"class_name\":\"Dense\",\"config\":{\"name\":\"d\",\"units\":3}}]}}")
file(WRITE ${mdir}/channels_first.json
     "${seq_head},{\"class_name\":\"Conv2D\",\"config\":{\"name\":\"c\",\"filters\":2,\"kernel_size\":3,\"data_format\":\"channels_first\"}}]}}")
# (the expected texts stop before the messages' ';', a CMake list separator)
distrain_error_test(model_input_shape 2 "keras3_dag.json' takes inputs of shape (6, 6, 2)"
                    --model ${CMAKE_CURRENT_SOURCE_DIR}/data/keras3_dag.json --quiet)
# 3 outputs are a classifier too, but the IDX sets have 10 classes; one output is no classifier
file(WRITE ${mdir}/one_output.json
     "${seq_head},{\"class_name\":\"Flatten\",\"config\":{\"name\":\"f\"}},{\"class_name\":\"Dense\",\"config\":{\"name\":\"d\",\"units\":1}}]}}")
distrain_error_test(model_classes_idx 2 "takes (28, 28, 1) images into 3 classes"
                    --model ${mdir}/three_outputs.json --quiet)
distrain_error_test(model_output_shape 2 "one_output.json' has outputs of shape (1,)"
                    --model ${mdir}/one_output.json --quiet)

# The input shape comes from the model: a (32, 32, 3) CNN trains on the MNIST JPEG folders, each
# grayscale digit decoded to RGB and resized to 32 x 32 (2 epochs of 25 steps); the IDX sets,
# which are (28, 28, 1), are refused for it
set(rgb_head "{\"class_name\":\"Sequential\",\"config\":{\"name\":\"rgb\",\"layers\":[{\"class_name\":\"InputLayer\",\"config\":{\"batch_shape\":[null,32,32,3],\"name\":\"in\"}}")
file(WRITE ${mdir}/rgb32.json
     "${rgb_head},{\"class_name\":\"Conv2D\",\"config\":{\"name\":\"c1\",\"filters\":16,\"kernel_size\":3,\"activation\":\"relu\"}},{\"class_name\":\"MaxPooling2D\",\"config\":{\"name\":\"p1\",\"pool_size\":2}},{\"class_name\":\"Conv2D\",\"config\":{\"name\":\"c2\",\"filters\":32,\"kernel_size\":3,\"activation\":\"relu\"}},{\"class_name\":\"MaxPooling2D\",\"config\":{\"name\":\"p2\",\"pool_size\":2}},{\"class_name\":\"Flatten\",\"config\":{\"name\":\"f\"}},{\"class_name\":\"Dense\",\"config\":{\"name\":\"d\",\"units\":10,\"activation\":\"softmax\"}}]}}")
add_test(NAME distrain.model_rgb32_jpeg_folder
         COMMAND ${CMAKE_COMMAND} -DDISTRAIN=$<TARGET_FILE:distrain>
                 "-DARGS=--model;${mdir}/rgb32.json;--data-format;jpeg-folder;--data-dir;${jpeg_dir};--epochs;2;--steps-per-epoch;25"
                 -DOUT=${mdir}/metrics_rgb32.json -DMIN_ACCURACY=0.6 -DSTEPS=50
                 -P ${CMAKE_CURRENT_SOURCE_DIR}/cli/accuracy.cmake)
set_tests_properties(distrain.model_rgb32_jpeg_folder
                     PROPERTIES LABELS cli FIXTURES_REQUIRED jpeg_mnist TIMEOUT 300)
distrain_error_test(model_rgb32_idx 2 "takes (32, 32, 3) images into 10 classes"
                    --model ${mdir}/rgb32.json --quiet)
distrain_error_test(model_unsupported 2 "layer 'c' (Conv2D): argument 'data_format' is 'channels_first'"
                    --model ${mdir}/channels_first.json --quiet)
distrain_error_test(model_unreadable 2 "--model: cannot read '/nonexistent/m.json'"
                    --model /nonexistent/m.json --quiet)

# A model tf-keras saved under mixed_bfloat16 (tests/data/tf_keras_mixed_resnet_mnist.json: every
# layer's dtype that policy, Keras's float32 softmax head) trains under it; --mixed-precision
# overrides it; a mixed_float16 model is refused where loss scaling is (central_storage)
set(mixed_json ${CMAKE_CURRENT_SOURCE_DIR}/data/tf_keras_mixed_resnet_mnist.json)
add_test(NAME distrain.model_mixed_policy
         COMMAND ${expect} 0 "Mixed precision: mixed_bfloat16" $<TARGET_FILE:distrain>
                 --model ${mixed_json} --epochs 1 --steps-per-epoch 20 --batch-size 64
                 --save-model ${mdir}/mixed.keras)
set_tests_properties(distrain.model_mixed_policy PROPERTIES LABELS cli TIMEOUT 300)
add_test(NAME distrain.model_mixed_policy_overridden
         COMMAND ${expect} 0 "Mixed precision: mixed_float16" $<TARGET_FILE:distrain>
                 --model ${mixed_json} --mixed-precision fp16 --epochs 1 --steps-per-epoch 5
                 --batch-size 64)
set_tests_properties(distrain.model_mixed_policy_overridden PROPERTIES LABELS cli TIMEOUT 300)
file(READ ${mixed_json} mixed_text)
string(REPLACE "mixed_bfloat16" "mixed_float16" mixed_text "${mixed_text}")
file(WRITE ${mdir}/mixed_float16.json "${mixed_text}")
distrain_error_test(model_mixed_float16_central_storage 2 "the model's policy is mixed_float16"
                    --model ${mdir}/mixed_float16.json --strategy central_storage --quiet)
