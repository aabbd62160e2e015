# distrain --model on a token classifier (an int32 input read by an Embedding): TFRecords whose
# tf.train.Examples hold an Int64List of 16 ids and an int64 label, written by TensorFlow itself
# with the model's JSON from tf_keras (tests/cli/make_token_tfrecords.py: label 1 when token 7
# appears; 2,000 training and 500 test sequences). Every strategy learns it (1.0 measured in 3
# epochs on every one; 0.95 required): 32 steps an epoch (31 full batches and a partial one),
# 31 under tpu (the partial batch dropped). An id outside the Embedding's vocabulary, one beyond
# int64's int32 range and a short list are named before the training; IDX data is refused.
set(token_dir ${CMAKE_CURRENT_BINARY_DIR}/token_tfrecords)
add_test(NAME distrain.token_fixtures
         COMMAND sh -c "rm -rf '${token_dir}' && TF_CPP_MIN_LOG_LEVEL=3 '${DIST_CONF_VENV}/bin/python' '${CMAKE_CURRENT_SOURCE_DIR}/cli/make_token_tfrecords.py' '${token_dir}'")
set_tests_properties(distrain.token_fixtures PROPERTIES FIXTURES_SETUP token_tfrecords
                     FIXTURES_REQUIRED tf_venv LABELS cli TIMEOUT 300)
set(token_args "--model;${token_dir}/model.json;--data-format;tfrecord;--data-dir;${token_dir};--feature-keys;tokens=ids,label=label;--epochs;3;--threads;1;--learning-rate;0.01")
# The same task through recurrent layers (model_recurrent.json: Embedding -> LSTM(16,
# return_sequences) -> GRU(16, go_backwards) -> Dense(2), from tf_keras): 1.0 measured in 3
# epochs under every strategy (distrain.tokens_recurrent_*).
string(REPLACE "/model.json" "/model_recurrent.json" recurrent_args "${token_args}")
# Under a mask (model_masked.json: Embedding(mask_zero=True) -> Bidirectional(LSTM(16,
# dropout=0.1, recurrent_dropout=0.1)) -> Dense(16, relu) -> Dense(2), from tf_keras) on the
# padded set (3 to 16 ids, then zeros) (distrain.tokens_masked_*).
string(REPLACE "/model.json" "/model_masked.json" masked_args "${token_args}")
string(REPLACE "--data-dir;${token_dir}" "--data-dir;${token_dir}/padded" masked_args
       "${masked_args}")
# Through masked, causal self-attention on the padded set (model_attention.json, from tf_keras:
# Embedding(mask_zero=True) -> MultiHeadAttention(dropout=0.1, use_causal_mask=True) with a
# residual Add and
# LayerNormalization -> the masked mean -> Dense(16, relu) -> Dense(2))
# (distrain.tokens_attention_*).
string(REPLACE "/model_masked.json" "/model_attention.json" attention_args "${masked_args}")
foreach(token_model "tokens;token_args" "tokens_recurrent;recurrent_args"
                    "tokens_masked;masked_args" "tokens_attention;attention_args")
  list(GET token_model 0 token_prefix)
  list(GET token_model 1 token_model_args)
  foreach(token_case "one_device;" "mirrored;" "multi_worker;--workers;2" "parameter_server;--workers;2;--ps;1")
    list(GET token_case 0 token_kind)
    list(SUBLIST token_case 1 -1 token_extra)
    add_test(NAME distrain.${token_prefix}_${token_kind}
             COMMAND ${CMAKE_COMMAND} -DDISTRAIN=$<TARGET_FILE:distrain> -DSTRATEGY=${token_kind}
                     "-DARGS=${${token_model_args}};${token_extra}"
                     -DOUT=${CMAKE_CURRENT_BINARY_DIR}/metrics_${token_prefix}_${token_kind}.json
                     -DMIN_ACCURACY=0.95 -DSTEPS=96 -P ${CMAKE_CURRENT_SOURCE_DIR}/cli/accuracy.cmake)
    set_tests_properties(distrain.${token_prefix}_${token_kind} PROPERTIES LABELS cli
                         FIXTURES_REQUIRED token_tfrecords TIMEOUT 300)
  endforeach()
endforeach()
# (the tpu cases are in tpu.cmake, after the PJRT plugin's fixture)
foreach(token_bad "out_of_vocab;1;id 60 (position 15 of 16) is not in [0, 50), the Embedding's vocabulary"
                  "out_of_range;1;id 1099511627776 (position 15 of 16) is not in [0, 50)"
                  "short;1;record 20: feature 'ids': holds 15 values, its shape holds 16")
  list(GET token_bad 0 token_name)
  list(GET token_bad 1 token_rc)
  list(GET token_bad 2 token_text)
  add_test(NAME distrain.tokens_${token_name}
           COMMAND ${expect} ${token_rc} ${token_text} $<TARGET_FILE:distrain> --model ${token_dir}/model.json
                   --data-format tfrecord --data-dir ${token_dir}/${token_name}
                   --feature-keys tokens=ids,label=label --quiet)
  set_tests_properties(distrain.tokens_${token_name} PROPERTIES LABELS cli
                       FIXTURES_REQUIRED token_tfrecords TIMEOUT 60)
endforeach()
# A tf_keras model with masked attention and dropout is not written as Keras 3's .keras (Keras 3
# zeroes the rows that keep no key on its dropout path, tf_keras weighs every key equally);
# distrain keeps the weights in its own folder instead.
file(MAKE_DIRECTORY ${CMAKE_CURRENT_BINARY_DIR}/attention_keras_refused)
add_test(NAME distrain.tokens_attention_keras_refused
         COMMAND sh -c "rm -f m.keras distrain-weights-*; '$<TARGET_FILE:distrain>' --model '${token_dir}/model_attention.json' --data-format tfrecord --data-dir '${token_dir}/padded' --feature-keys tokens=ids,label=label --epochs 0 --save-model m.keras --quiet 2> err; rc=$?; cat err; test $rc = 1 && grep -q \"masked attention with dropout from a tf_keras file cannot be written as Keras 3's .keras\" err && test ! -e m.keras && ls distrain-weights-*.safetensors")
set_tests_properties(distrain.tokens_attention_keras_refused PROPERTIES LABELS cli
                     FIXTURES_REQUIRED token_tfrecords TIMEOUT 60
                     WORKING_DIRECTORY ${CMAKE_CURRENT_BINARY_DIR}/attention_keras_refused)
add_test(NAME distrain.tokens_refuse_idx
         COMMAND ${expect} 2 "the model reads 16 token ids (an int32 input); give them as --data-format tfrecord"
                 $<TARGET_FILE:distrain> --model ${token_dir}/model.json --quiet)
set_tests_properties(distrain.tokens_refuse_idx PROPERTIES LABELS cli
                     FIXTURES_REQUIRED token_tfrecords TIMEOUT 60)
