# The tpu strategy on XLA's own CPU PJRT plugin (the pjrt_venv fixture installs it from PyPI;
# tests/cmake/pjrt.cmake). Without the fixture these fail: the plugin path does not exist.
add_executable(tpu_vs_mirrored ${CMAKE_CURRENT_SOURCE_DIR}/tpu/tpu_vs_mirrored.c)
target_link_libraries(tpu_vs_mirrored PRIVATE dist m)
target_compile_options(tpu_vs_mirrored PRIVATE ${DIST_WARNINGS})
set(tpu_dump ${CMAKE_CURRENT_BINARY_DIR}/tpu_dump)
# Under AddressSanitizer, the plugin's own never-freed allocations are not reported (libdist's
# are): tests/tpu/pjrt_lsan.supp.
set(tpu_env "LSAN_OPTIONS=suppressions=${CMAKE_CURRENT_SOURCE_DIR}/tpu/pjrt_lsan.supp")

# 20 steps from seed 42 on 2 devices against the C engine's mirrored strategy with 2 replicas:
# every loss within 1e-4 relative; the weights as a whole (relative L2) within 1e-4 under SGD
# and 1e-3 under Adam (tpu_vs_mirrored.c says why). The Adam run also dumps its programs: the
# steady-state step (the second program) must equal the golden StableHLO.
add_test(NAME tpu.vs_mirrored_adam
         COMMAND sh -c "rm -rf '${tpu_dump}' && mkdir -p '${tpu_dump}' && DIST_TPU_DUMP_DIR='${tpu_dump}' '$<TARGET_FILE:tpu_vs_mirrored>' '${DIST_TEST_PJRT_PLUGIN}' 2 20 1e-4 adam && cmp '${tpu_dump}/step-1.mlir' '${CMAKE_CURRENT_SOURCE_DIR}/tpu/golden/cnn_adam_step_2replicas.mlir' && echo 'golden StableHLO: equal'")
add_test(NAME tpu.vs_mirrored_sgd
         COMMAND tpu_vs_mirrored ${DIST_TEST_PJRT_PLUGIN} 2 20 1e-4 sgd)
add_test(NAME tpu.one_device_vs_one_replica
         COMMAND tpu_vs_mirrored ${DIST_TEST_PJRT_PLUGIN} 1 10 1e-4 sgd)
add_test(NAME tpu.errors COMMAND tpu_vs_mirrored ${DIST_TEST_PJRT_PLUGIN} errors)
# tf.debugging's assertions inside the compiled step: checked on the program's outputs after
# it, failing the right run with mirrored's message, byte for byte.
add_test(NAME tpu.asserts_like_mirrored COMMAND tpu_vs_mirrored ${DIST_TEST_PJRT_PLUGIN} asserts)
# steps_per_execution: 4 steps per program (unrolled, the default; and as a while loop), the
# losses of each group of 4 and the weights against mirrored's 20 single steps.
# Dynamic loss scaling decided inside the program (the finite test and the choice between the
# updated and the old parameters and slots are ops of it): mixed_float16 from a scale of 1e9,
# growing after 4 finite steps, 24 steps: the same scale, counter and skipped total as
# mirrored's host decision after every step, the same optimizer update count; one step per
# run, and 4 steps per run_steps (run one by one: each step's scale decides the next).
add_test(NAME tpu.loss_scale_like_mirrored
         COMMAND tpu_vs_mirrored ${DIST_TEST_PJRT_PLUGIN} loss_scale)
add_test(NAME tpu.loss_scale_steps_per_execution
         COMMAND tpu_vs_mirrored ${DIST_TEST_PJRT_PLUGIN} loss_scale 4)
# distrain --mixed-precision fp16 under tpu: the metrics' loss scale (scale, skipped steps)
# equals mirrored's on a run that overflows (dynamic from 1e9, 12 steps)
add_test(NAME distrain.tpu_fp16_loss_scale
         COMMAND sh -c "for k in mirrored tpu; do a='--strategy mirrored --devices cpu:0,cpu:1'; [ $k = tpu ] && a='--strategy tpu --tpu-cores 2 --pjrt-plugin ${DIST_TEST_PJRT_PLUGIN}'; '$<TARGET_FILE:distrain>' $a --quiet --mixed-precision fp16 --loss-scale dynamic:1e9 --epochs 1 --steps-per-epoch 12 --metrics-json ${CMAKE_CURRENT_BINARY_DIR}/tpu_fp16_$k.json || exit 1; done; python3 -c \"import json,sys; m,t=(json.load(open('${CMAKE_CURRENT_BINARY_DIR}/tpu_fp16_'+k+'.json'))['loss_scale'] for k in ('mirrored','tpu')); print('mirrored', m, 'tpu', t); sys.exit(0 if m == t and m['skipped_steps'] >= 1 else 1)\"")
add_test(NAME tpu.steps_per_execution_unrolled
         COMMAND tpu_vs_mirrored ${DIST_TEST_PJRT_PLUGIN} 2 20 1e-4 adam 4)
add_test(NAME tpu.steps_per_execution_loop
         COMMAND ${CMAKE_COMMAND} -E env DIST_TPU_STEPS_FORM=loop
                 $<TARGET_FILE:tpu_vs_mirrored> ${DIST_TEST_PJRT_PLUGIN} 2 20 1e-4 sgd 4)

# distrain --strategy tpu: >= 0.96 on the built-in subset in 5 epochs (124 full batches an
# epoch: the partial last batch is dropped, as TPUStrategy requires).
add_test(NAME distrain.tpu_accuracy
         COMMAND ${CMAKE_COMMAND} -DDISTRAIN=$<TARGET_FILE:distrain> -DSTRATEGY=tpu
                 "-DARGS=--pjrt-plugin;${DIST_TEST_PJRT_PLUGIN};--tpu-cores;2"
                 -DOUT=${CMAKE_CURRENT_BINARY_DIR}/metrics_tpu.json -DMIN_ACCURACY=0.96
                 -DSTEPS=620 -P ${CMAKE_CURRENT_SOURCE_DIR}/cli/accuracy.cmake)
# distrain --steps-per-execution 4 under tpu: the same accuracy floor; under mirrored (the
# default run_steps: k runs) the same losses as one step per run.
add_test(NAME distrain.tpu_steps_per_execution
         COMMAND ${CMAKE_COMMAND} -DDISTRAIN=$<TARGET_FILE:distrain> -DSTRATEGY=tpu
                 "-DARGS=--pjrt-plugin;${DIST_TEST_PJRT_PLUGIN};--tpu-cores;2;--steps-per-execution;4"
                 -DOUT=${CMAKE_CURRENT_BINARY_DIR}/metrics_tpu_spe.json -DMIN_ACCURACY=0.96
                 -DSTEPS=620 -P ${CMAKE_CURRENT_SOURCE_DIR}/cli/accuracy.cmake)
# A BackupAndRestore backup crosses strategies: tpu -> mirrored and mirrored -> tpu.
add_test(NAME distrain.tpu_cross_restore
         COMMAND sh ${CMAKE_CURRENT_SOURCE_DIR}/tpu/cross_restore.sh $<TARGET_FILE:distrain>
                 ${DIST_TEST_PJRT_PLUGIN} ${CMAKE_CURRENT_BINARY_DIR}/tpu_cross_restore)
# A Keras model of dilated and grouped Conv2D, DepthwiseConv2D, SeparableConv2D (dilated), Conv1D
# (causal, dilated) and MaxPooling1D (tests/data/keras3_conv_variants_mnist.json) trained 10 steps
# under tpu (2 CPU devices) and under mirrored (2 CPU replicas): the same training loss to 1e-4
# relative (stablehlo.convolution's dilations and groups against oneDNN's).
add_test(NAME distrain.tpu_conv_variants
         COMMAND sh -c "for k in mirrored tpu; do a='--strategy mirrored --devices cpu:0,cpu:1'; [ $k = tpu ] && a='--strategy tpu --tpu-cores 2 --pjrt-plugin ${DIST_TEST_PJRT_PLUGIN}'; '$<TARGET_FILE:distrain>' $a --quiet --model '${CMAKE_CURRENT_SOURCE_DIR}/data/keras3_conv_variants_mnist.json' --epochs 1 --steps-per-epoch 10 --seed 7 --metrics-json ${CMAKE_CURRENT_BINARY_DIR}/tpu_conv_variants_$k.json || exit 1; done; python3 -c \"import json,sys; m,t=(json.load(open('${CMAKE_CURRENT_BINARY_DIR}/tpu_conv_variants_'+k+'.json'))['train_loss'] for k in ('mirrored','tpu')); print('train loss: mirrored', m, 'tpu', t); sys.exit(0 if abs(m - t) <= 1e-4 * abs(m) else 1)\"")
# distrain_tokens.cmake's token classifier under tpu (2 CPU devices): int32 ids through the
# traced Embedding; 31 full batches an epoch (the partial one dropped), 3 epochs.
add_test(NAME distrain.tokens_tpu
         COMMAND ${CMAKE_COMMAND} -DDISTRAIN=$<TARGET_FILE:distrain> -DSTRATEGY=tpu
                 "-DARGS=${token_args};--pjrt-plugin;${DIST_TEST_PJRT_PLUGIN};--tpu-cores;2"
                 -DOUT=${CMAKE_CURRENT_BINARY_DIR}/metrics_tokens_tpu.json
                 -DMIN_ACCURACY=0.95 -DSTEPS=93 -P ${CMAKE_CURRENT_SOURCE_DIR}/cli/accuracy.cmake)
set_tests_properties(distrain.tokens_tpu PROPERTIES FIXTURES_REQUIRED "token_tfrecords;pjrt_venv"
                     LABELS "tpu;cli" TIMEOUT 600 RESOURCE_LOCK cpu_heavy_tpu
                     ENVIRONMENT "${tpu_env}")
# Its recurrent twin (LSTM into a GRU run backwards, 16 steps unrolled into the program), and
# the masked one on the padded set (the masked steps and the LSTM's dropout masks in the
# program), and masked causal attention on it (the attention mask composed in the program).
foreach(token_model "tokens_recurrent;recurrent_args" "tokens_masked;masked_args"
                    "tokens_attention;attention_args")
  list(GET token_model 0 token_prefix)
  list(GET token_model 1 token_model_args)
  add_test(NAME distrain.${token_prefix}_tpu
           COMMAND ${CMAKE_COMMAND} -DDISTRAIN=$<TARGET_FILE:distrain> -DSTRATEGY=tpu
                   "-DARGS=${${token_model_args}};--pjrt-plugin;${DIST_TEST_PJRT_PLUGIN};--tpu-cores;2"
                   -DOUT=${CMAKE_CURRENT_BINARY_DIR}/metrics_${token_prefix}_tpu.json
                   -DMIN_ACCURACY=0.95 -DSTEPS=93 -P ${CMAKE_CURRENT_SOURCE_DIR}/cli/accuracy.cmake)
  set_tests_properties(distrain.${token_prefix}_tpu PROPERTIES
                       FIXTURES_REQUIRED "token_tfrecords;pjrt_venv" LABELS "tpu;cli" TIMEOUT 600
                       RESOURCE_LOCK cpu_heavy_tpu ENVIRONMENT "${tpu_env}")
endforeach()
# Usage errors: tpu flags without tpu, and what a compiled step cannot do.
add_test(NAME distrain.tpu_usage
         COMMAND sh -c "'$<TARGET_FILE:distrain>' --tpu-cores 2 --epochs 1 2>&1 | grep -q 'apply to --strategy tpu only' && '$<TARGET_FILE:distrain>' --strategy tpu --tpu grpc://10.0.0.2:8470 --pjrt-plugin '${DIST_TEST_PJRT_PLUGIN}' --epochs 1 2>&1 | grep -q 'remote TPU nodes are not supported' && '$<TARGET_FILE:distrain>' --strategy tpu --pjrt-plugin '${DIST_TEST_LIBTPU}' --epochs 1 2>&1 | grep -q 'no TPU devices found on this host'")
set_tests_properties(tpu.vs_mirrored_adam tpu.vs_mirrored_sgd tpu.one_device_vs_one_replica
                     tpu.errors tpu.asserts_like_mirrored tpu.steps_per_execution_unrolled tpu.steps_per_execution_loop
                     tpu.loss_scale_like_mirrored tpu.loss_scale_steps_per_execution distrain.tpu_fp16_loss_scale
                     distrain.tpu_cross_restore distrain.tpu_usage distrain.tpu_conv_variants
                     PROPERTIES FIXTURES_REQUIRED pjrt_venv LABELS "tpu;cli" TIMEOUT 900
                     RESOURCE_LOCK cpu_heavy_tpu ENVIRONMENT "${tpu_env}")
# 5 epochs each: the first stage runs them, the sanitizer stage leaves them out (slow)
set_tests_properties(distrain.tpu_accuracy distrain.tpu_steps_per_execution
                     PROPERTIES FIXTURES_REQUIRED pjrt_venv LABELS "tpu;cli;slow" TIMEOUT 900
                     RESOURCE_LOCK cpu_heavy_tpu ENVIRONMENT "${tpu_env}")

# distrain's clipping flags and --check-numerics under tpu: the norms are ops of the program,
# the checks run on its outputs after each step (5 steps each run).
add_test(NAME distrain.tpu_clipping
         COMMAND sh -c "for f in '--global-clipnorm 1' '--clipnorm 0.5' '--clipvalue 0.01' '--check-numerics'; do '$<TARGET_FILE:distrain>' --strategy tpu --pjrt-plugin '${DIST_TEST_PJRT_PLUGIN}' --tpu-cores 2 --epochs 1 --steps-per-epoch 5 --quiet $f || exit 1; done")
set_tests_properties(distrain.tpu_clipping PROPERTIES FIXTURES_REQUIRED pjrt_venv
                     LABELS "tpu;cli" TIMEOUT 600 RESOURCE_LOCK cpu_heavy_tpu
                     ENVIRONMENT "${tpu_env}")

# examples/custom_model.c under tpu against mirrored: Conv2D, synchronized BatchNormalization,
# Dropout, AveragePooling2D, a residual add, math-op loss and global clipping, 20 steps within
# 1e-4 relative loss; with dropout on, reruns repeat bit for bit (the script says how).
add_test(NAME tpu.custom_model_vs_mirrored
         COMMAND sh ${CMAKE_CURRENT_SOURCE_DIR}/tpu/custom_model_vs_mirrored.sh
                 $<TARGET_FILE:example_custom_model> ${DIST_TEST_PJRT_PLUGIN}
                 ${CMAKE_CURRENT_BINARY_DIR}/tpu_custom_model 1e-4)
set_tests_properties(tpu.custom_model_vs_mirrored PROPERTIES FIXTURES_REQUIRED pjrt_venv
                     LABELS "tpu;example" TIMEOUT 900 RESOURCE_LOCK cpu_heavy_tpu
                     ENVIRONMENT "${tpu_env}")

# The default run_steps (every other kind): k runs, the same training as one step per run.
set(spe_dir ${CMAKE_CURRENT_BINARY_DIR}/spe_mirrored)
add_test(NAME distrain.steps_per_execution_mirrored
         COMMAND sh -c "mkdir -p '${spe_dir}' && for k in 1 4; do '$<TARGET_FILE:distrain>' --strategy mirrored --devices cpu:0,cpu:1 --threads 1 --epochs 2 --steps-per-epoch 30 --quiet --steps-per-execution $k --metrics-json '${spe_dir}'/m$k.json || exit 1; grep -E '\"(train_loss|test_loss|steps)\"' '${spe_dir}'/m$k.json > '${spe_dir}'/l$k.txt; done && test -s '${spe_dir}'/l1.txt && cmp '${spe_dir}'/l1.txt '${spe_dir}'/l4.txt && cat '${spe_dir}'/l4.txt")
set_tests_properties(distrain.steps_per_execution_mirrored PROPERTIES LABELS cli TIMEOUT 300)

# Strategy variables trained by an optimizer under tpu (tests/unit/test_train_variables.c in
# its tpu mode): the same weights as the Sequential model after 4 steps on 2 cores, the
# optimizer's state through a checkpoint, and again with global clipping (traced op by op).
add_test(NAME tpu.train_variables
         COMMAND test_train_variables tpu ${DIST_TEST_PJRT_PLUGIN})
set_tests_properties(tpu.train_variables PROPERTIES FIXTURES_REQUIRED pjrt_venv
                     LABELS "tpu;integration" TIMEOUT 600
                     ENVIRONMENT "${unit_env};${tpu_env}")

# The op set under the tpu strategy's symbolic backend (tests/unit/test_trace_ops.c in its
# plugin mode): every opcode as a program on the CPU plugin against the CPU backend's results,
# the dropout mask's bits per replica and per step of a k-step program.
add_test(NAME tpu.trace_ops COMMAND test_trace_ops cpu_plugin ${DIST_TEST_PJRT_PLUGIN})
set_tests_properties(tpu.trace_ops PROPERTIES FIXTURES_REQUIRED pjrt_venv
                     LABELS "tpu;integration" TIMEOUT 600
                     ENVIRONMENT "${unit_env};${tpu_env}")

# Dropout traced into the program (tests/unit/test_layers.c in its tpu mode): the masks of 2
# replicas over two runs equal mirrored's bit for bit.
add_test(NAME tpu.layers COMMAND test_layers tpu ${DIST_TEST_PJRT_PLUGIN})
set_tests_properties(tpu.layers PROPERTIES FIXTURES_REQUIRED pjrt_venv
                     LABELS "tpu;integration" TIMEOUT 300
                     ENVIRONMENT "${unit_env};${tpu_env}")
