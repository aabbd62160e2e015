# A layer graph (Rescaling with an offset, ZeroPadding2D, LayerNormalization, Add, Concatenate,
# GlobalMaxPooling2D, a softmax head) traced into the tpu strategy's program on XLA's CPU
# plugin (tests/unit/test_model_graph.c in its tpu mode): 3 SGD steps on 2 replicas give
# mirrored's losses and weights within 1e-5; and so does a Transformer encoder block on int32
# token ids (Embedding, MultiHeadAttention, LayerNormalization, GELU feed-forward).
add_test(NAME tpu.model_graph COMMAND test_model_graph tpu ${DIST_TEST_PJRT_PLUGIN})
set_tests_properties(tpu.model_graph PROPERTIES FIXTURES_REQUIRED pjrt_venv
                     LABELS "tpu;integration" TIMEOUT 300
                     ENVIRONMENT "${unit_env};${tpu_env}")
