module @libdist_step attributes {mhlo.num_partitions = 1 : i32, mhlo.num_replicas = 2 : i32} {
  func.func public @main(%scalars: tensor<5xf32>, %arg1: tensor<121930xf32> {tf.aliasing_output = 0 : i32}, %arg2: tensor<121930xf32> {tf.aliasing_output = 3 : i32}, %arg3: tensor<121930xf32> {tf.aliasing_output = 2 : i32}, %arg4: tensor<32x28x28x1xf32>, %arg5: tensor<32xi32>) -> (tensor<121930xf32>, tensor<121930xf32>, tensor<121930xf32>, tensor<121930xf32>, tensor<f32>) {
    %v2 = "stablehlo.reshape"(%arg4) : (tensor<32x28x28x1xf32>) -> tensor<25088xf32>
    %v4 = "stablehlo.slice"(%arg1) {limit_indices = array<i64: 288>, start_indices = array<i64: 0>, strides = array<i64: 1>} : (tensor<121930xf32>) -> tensor<288xf32>
    %v5 = "stablehlo.reshape"(%v4) : (tensor<288xf32>) -> tensor<3x3x1x32xf32>
    %v6 = "stablehlo.convolution"(%arg4, %v5) {batch_group_count = 1 : i64, dimension_numbers = #stablehlo.conv<[b, 0, 1, f]x[0, 1, i, o]->[b, 0, 1, f]>, feature_group_count = 1 : i64, lhs_dilation = array<i64: 1, 1>, padding = dense<[[0, 0], [0, 0]]> : tensor<2x2xi64>, rhs_dilation = array<i64: 1, 1>, window_strides = array<i64: 1, 1>} : (tensor<32x28x28x1xf32>, tensor<3x3x1x32xf32>) -> tensor<32x26x26x32xf32>
    %v7 = "stablehlo.slice"(%arg1) {limit_indices = array<i64: 320>, start_indices = array<i64: 288>, strides = array<i64: 1>} : (tensor<121930xf32>) -> tensor<32xf32>
    %t0 = "stablehlo.broadcast_in_dim"(%v7) {broadcast_dimensions = array<i64: 3>} : (tensor<32xf32>) -> tensor<32x26x26x32xf32>
    %v8 = "stablehlo.add"(%v6, %t0) : (tensor<32x26x26x32xf32>, tensor<32x26x26x32xf32>) -> tensor<32x26x26x32xf32>
    %v9 = "stablehlo.constant"() {value = dense<0x00000000> : tensor<32x26x26x32xf32>} : () -> tensor<32x26x26x32xf32>
    %v10 = "stablehlo.maximum"(%v8, %v9) : (tensor<32x26x26x32xf32>, tensor<32x26x26x32xf32>) -> tensor<32x26x26x32xf32>
    %v11 = "stablehlo.reshape"(%v10) : (tensor<32x26x26x32xf32>) -> tensor<692224xf32>
    %t1 = "stablehlo.constant"() {value = dense<0xFF800000> : tensor<f32>} : () -> tensor<f32>
    %v12 = "stablehlo.reduce_window"(%v10, %t1) ({
    ^bb0(%t2: tensor<f32>, %t3: tensor<f32>):
      %t4 = "stablehlo.maximum"(%t2, %t3) : (tensor<f32>, tensor<f32>) -> tensor<f32>
      "stablehlo.return"(%t4) : (tensor<f32>) -> ()
    }) {padding = dense<[[0, 0], [0, 0], [0, 0], [0, 0]]> : tensor<4x2xi64>, window_dimensions = array<i64: 1, 2, 2, 1>, window_strides = array<i64: 1, 2, 2, 1>} : (tensor<32x26x26x32xf32>, tensor<f32>) -> tensor<32x13x13x32xf32>
    %v13 = "stablehlo.reshape"(%v12) : (tensor<32x13x13x32xf32>) -> tensor<173056xf32>
    %v14 = "stablehlo.slice"(%arg1) {limit_indices = array<i64: 18752>, start_indices = array<i64: 320>, strides = array<i64: 1>} : (tensor<121930xf32>) -> tensor<18432xf32>
    %v15 = "stablehlo.reshape"(%v14) : (tensor<18432xf32>) -> tensor<3x3x32x64xf32>
    %v16 = "stablehlo.convolution"(%v12, %v15) {batch_group_count = 1 : i64, dimension_numbers = #stablehlo.conv<[b, 0, 1, f]x[0, 1, i, o]->[b, 0, 1, f]>, feature_group_count = 1 : i64, lhs_dilation = array<i64: 1, 1>, padding = dense<[[0, 0], [0, 0]]> : tensor<2x2xi64>, rhs_dilation = array<i64: 1, 1>, window_strides = array<i64: 1, 1>} : (tensor<32x13x13x32xf32>, tensor<3x3x32x64xf32>) -> tensor<32x11x11x64xf32>
    %v17 = "stablehlo.slice"(%arg1) {limit_indices = array<i64: 18816>, start_indices = array<i64: 18752>, strides = array<i64: 1>} : (tensor<121930xf32>) -> tensor<64xf32>
    %t5 = "stablehlo.broadcast_in_dim"(%v17) {broadcast_dimensions = array<i64: 3>} : (tensor<64xf32>) -> tensor<32x11x11x64xf32>
    %v18 = "stablehlo.add"(%v16, %t5) : (tensor<32x11x11x64xf32>, tensor<32x11x11x64xf32>) -> tensor<32x11x11x64xf32>
    %v19 = "stablehlo.constant"() {value = dense<0x00000000> : tensor<32x11x11x64xf32>} : () -> tensor<32x11x11x64xf32>
    %v20 = "stablehlo.maximum"(%v18, %v19) : (tensor<32x11x11x64xf32>, tensor<32x11x11x64xf32>) -> tensor<32x11x11x64xf32>
    %v21 = "stablehlo.reshape"(%v20) : (tensor<32x11x11x64xf32>) -> tensor<247808xf32>
    %t6 = "stablehlo.constant"() {value = dense<0xFF800000> : tensor<f32>} : () -> tensor<f32>
    %v22 = "stablehlo.reduce_window"(%v20, %t6) ({
    ^bb0(%t7: tensor<f32>, %t8: tensor<f32>):
      %t9 = "stablehlo.maximum"(%t7, %t8) : (tensor<f32>, tensor<f32>) -> tensor<f32>
      "stablehlo.return"(%t9) : (tensor<f32>) -> ()
    }) {padding = dense<[[0, 0], [0, 0], [0, 0], [0, 0]]> : tensor<4x2xi64>, window_dimensions = array<i64: 1, 2, 2, 1>, window_strides = array<i64: 1, 2, 2, 1>} : (tensor<32x11x11x64xf32>, tensor<f32>) -> tensor<32x5x5x64xf32>
    %v23 = "stablehlo.reshape"(%v22) : (tensor<32x5x5x64xf32>) -> tensor<51200xf32>
    %v24 = "stablehlo.reshape"(%v23) : (tensor<51200xf32>) -> tensor<32x1600xf32>
    %v25 = "stablehlo.slice"(%arg1) {limit_indices = array<i64: 121216>, start_indices = array<i64: 18816>, strides = array<i64: 1>} : (tensor<121930xf32>) -> tensor<102400xf32>
    %v26 = "stablehlo.reshape"(%v25) : (tensor<102400xf32>) -> tensor<1600x64xf32>
    %v27 = "stablehlo.dot_general"(%v24, %v26) {dot_dimension_numbers = #stablehlo.dot<lhs_contracting_dimensions = [1], rhs_contracting_dimensions = [0]>} : (tensor<32x1600xf32>, tensor<1600x64xf32>) -> tensor<32x64xf32>
    %v28 = "stablehlo.reshape"(%v27) : (tensor<32x64xf32>) -> tensor<2048xf32>
    %v29 = "stablehlo.slice"(%arg1) {limit_indices = array<i64: 121280>, start_indices = array<i64: 121216>, strides = array<i64: 1>} : (tensor<121930xf32>) -> tensor<64xf32>
    %t10 = "stablehlo.broadcast_in_dim"(%v29) {broadcast_dimensions = array<i64: 1>} : (tensor<64xf32>) -> tensor<32x64xf32>
    %v30 = "stablehlo.add"(%v27, %t10) : (tensor<32x64xf32>, tensor<32x64xf32>) -> tensor<32x64xf32>
    %v31 = "stablehlo.constant"() {value = dense<0x00000000> : tensor<32x64xf32>} : () -> tensor<32x64xf32>
    %v32 = "stablehlo.maximum"(%v30, %v31) : (tensor<32x64xf32>, tensor<32x64xf32>) -> tensor<32x64xf32>
    %v33 = "stablehlo.reshape"(%v32) : (tensor<32x64xf32>) -> tensor<2048xf32>
    %v34 = "stablehlo.slice"(%arg1) {limit_indices = array<i64: 121920>, start_indices = array<i64: 121280>, strides = array<i64: 1>} : (tensor<121930xf32>) -> tensor<640xf32>
    %v35 = "stablehlo.reshape"(%v34) : (tensor<640xf32>) -> tensor<64x10xf32>
    %v36 = "stablehlo.dot_general"(%v32, %v35) {dot_dimension_numbers = #stablehlo.dot<lhs_contracting_dimensions = [1], rhs_contracting_dimensions = [0]>} : (tensor<32x64xf32>, tensor<64x10xf32>) -> tensor<32x10xf32>
    %v37 = "stablehlo.reshape"(%v36) : (tensor<32x10xf32>) -> tensor<320xf32>
    %v38 = "stablehlo.slice"(%arg1) {limit_indices = array<i64: 121930>, start_indices = array<i64: 121920>, strides = array<i64: 1>} : (tensor<121930xf32>) -> tensor<10xf32>
    %t11 = "stablehlo.broadcast_in_dim"(%v38) {broadcast_dimensions = array<i64: 1>} : (tensor<10xf32>) -> tensor<32x10xf32>
    %v39 = "stablehlo.add"(%v36, %t11) : (tensor<32x10xf32>, tensor<32x10xf32>) -> tensor<32x10xf32>
    %v40 = "stablehlo.reshape"(%v39) : (tensor<32x10xf32>) -> tensor<320xf32>
    %t12 = "stablehlo.iota"() {iota_dimension = 1 : i64} : () -> tensor<32x10xi32>
    %t13 = "stablehlo.broadcast_in_dim"(%arg5) {broadcast_dimensions = array<i64: 0>} : (tensor<32xi32>) -> tensor<32x10xi32>
    %t14 = "stablehlo.compare"(%t12, %t13) {comparison_direction = #stablehlo<comparison_direction EQ>} : (tensor<32x10xi32>, tensor<32x10xi32>) -> tensor<32x10xi1>
    %t15 = "stablehlo.constant"() {value = dense<0x3F800000> : tensor<32x10xf32>} : () -> tensor<32x10xf32>
    %t16 = "stablehlo.constant"() {value = dense<0x00000000> : tensor<32x10xf32>} : () -> tensor<32x10xf32>
    %t17 = "stablehlo.select"(%t14, %t15, %t16) : (tensor<32x10xi1>, tensor<32x10xf32>, tensor<32x10xf32>) -> tensor<32x10xf32>
    %t20 = "stablehlo.constant"() {value = dense<0xFF800000> : tensor<f32>} : () -> tensor<f32>
    %t18 = "stablehlo.reduce"(%v39, %t20) ({
    ^bb0(%t21: tensor<f32>, %t22: tensor<f32>):
      %t23 = "stablehlo.maximum"(%t21, %t22) : (tensor<f32>, tensor<f32>) -> tensor<f32>
      "stablehlo.return"(%t23) : (tensor<f32>) -> ()
    }) {dimensions = array<i64: 1>} : (tensor<32x10xf32>, tensor<f32>) -> tensor<32xf32>
    %t19 = "stablehlo.broadcast_in_dim"(%t18) {broadcast_dimensions = array<i64: 0>} : (tensor<32xf32>) -> tensor<32x10xf32>
    %t24 = "stablehlo.subtract"(%v39, %t19) : (tensor<32x10xf32>, tensor<32x10xf32>) -> tensor<32x10xf32>
    %t25 = "stablehlo.exponential"(%t24) : (tensor<32x10xf32>) -> tensor<32x10xf32>
    %t27 = "stablehlo.constant"() {value = dense<0x00000000> : tensor<f32>} : () -> tensor<f32>
    %t26 = "stablehlo.reduce"(%t25, %t27) ({
    ^bb0(%t28: tensor<f32>, %t29: tensor<f32>):
      %t30 = "stablehlo.add"(%t28, %t29) : (tensor<f32>, tensor<f32>) -> tensor<f32>
      "stablehlo.return"(%t30) : (tensor<f32>) -> ()
    }) {dimensions = array<i64: 1>} : (tensor<32x10xf32>, tensor<f32>) -> tensor<32xf32>
    %t31 = "stablehlo.log"(%t26) : (tensor<32xf32>) -> tensor<32xf32>
    %t32 = "stablehlo.multiply"(%t24, %t17) : (tensor<32x10xf32>, tensor<32x10xf32>) -> tensor<32x10xf32>
    %t34 = "stablehlo.constant"() {value = dense<0x00000000> : tensor<f32>} : () -> tensor<f32>
    %t33 = "stablehlo.reduce"(%t32, %t34) ({
    ^bb0(%t35: tensor<f32>, %t36: tensor<f32>):
      %t37 = "stablehlo.add"(%t35, %t36) : (tensor<f32>, tensor<f32>) -> tensor<f32>
      "stablehlo.return"(%t37) : (tensor<f32>) -> ()
    }) {dimensions = array<i64: 1>} : (tensor<32x10xf32>, tensor<f32>) -> tensor<32xf32>
    %v41 = "stablehlo.subtract"(%t31, %t33) : (tensor<32xf32>, tensor<32xf32>) -> tensor<32xf32>
    %t38 = "stablehlo.iota"() {iota_dimension = 1 : i64} : () -> tensor<32x10xi32>
    %t39 = "stablehlo.broadcast_in_dim"(%arg5) {broadcast_dimensions = array<i64: 0>} : (tensor<32xi32>) -> tensor<32x10xi32>
    %t40 = "stablehlo.compare"(%t38, %t39) {comparison_direction = #stablehlo<comparison_direction EQ>} : (tensor<32x10xi32>, tensor<32x10xi32>) -> tensor<32x10xi1>
    %t41 = "stablehlo.constant"() {value = dense<0x3F800000> : tensor<32x10xf32>} : () -> tensor<32x10xf32>
    %t42 = "stablehlo.constant"() {value = dense<0x00000000> : tensor<32x10xf32>} : () -> tensor<32x10xf32>
    %t43 = "stablehlo.select"(%t40, %t41, %t42) : (tensor<32x10xi1>, tensor<32x10xf32>, tensor<32x10xf32>) -> tensor<32x10xf32>
    %t46 = "stablehlo.constant"() {value = dense<0xFF800000> : tensor<f32>} : () -> tensor<f32>
    %t44 = "stablehlo.reduce"(%v39, %t46) ({
    ^bb0(%t47: tensor<f32>, %t48: tensor<f32>):
      %t49 = "stablehlo.maximum"(%t47, %t48) : (tensor<f32>, tensor<f32>) -> tensor<f32>
      "stablehlo.return"(%t49) : (tensor<f32>) -> ()
    }) {dimensions = array<i64: 1>} : (tensor<32x10xf32>, tensor<f32>) -> tensor<32xf32>
    %t45 = "stablehlo.broadcast_in_dim"(%t44) {broadcast_dimensions = array<i64: 0>} : (tensor<32xf32>) -> tensor<32x10xf32>
    %t50 = "stablehlo.subtract"(%v39, %t45) : (tensor<32x10xf32>, tensor<32x10xf32>) -> tensor<32x10xf32>
    %t51 = "stablehlo.exponential"(%t50) : (tensor<32x10xf32>) -> tensor<32x10xf32>
    %t53 = "stablehlo.constant"() {value = dense<0x00000000> : tensor<f32>} : () -> tensor<f32>
    %t52 = "stablehlo.reduce"(%t51, %t53) ({
    ^bb0(%t54: tensor<f32>, %t55: tensor<f32>):
      %t56 = "stablehlo.add"(%t54, %t55) : (tensor<f32>, tensor<f32>) -> tensor<f32>
      "stablehlo.return"(%t56) : (tensor<f32>) -> ()
    }) {dimensions = array<i64: 1>} : (tensor<32x10xf32>, tensor<f32>) -> tensor<32xf32>
    %t57 = "stablehlo.broadcast_in_dim"(%t52) {broadcast_dimensions = array<i64: 0>} : (tensor<32xf32>) -> tensor<32x10xf32>
    %v42 = "stablehlo.divide"(%t51, %t57) : (tensor<32x10xf32>, tensor<32x10xf32>) -> tensor<32x10xf32>
    %t59 = "stablehlo.constant"() {value = dense<0x00000000> : tensor<f32>} : () -> tensor<f32>
    %t58 = "stablehlo.reduce"(%v41, %t59) ({
    ^bb0(%t60: tensor<f32>, %t61: tensor<f32>):
      %t62 = "stablehlo.add"(%t60, %t61) : (tensor<f32>, tensor<f32>) -> tensor<f32>
      "stablehlo.return"(%t62) : (tensor<f32>) -> ()
    }) {dimensions = array<i64: 0>} : (tensor<32xf32>, tensor<f32>) -> tensor<f32>
    %v43 = "stablehlo.reshape"(%t58) : (tensor<f32>) -> tensor<f32>
    %v44 = "stablehlo.reshape"(%v43) : (tensor<f32>) -> tensor<1xf32>
    %v45 = "stablehlo.constant"() {value = dense<0x3C800000> : tensor<f32>} : () -> tensor<f32>
    %v46 = "stablehlo.multiply"(%v43, %v45) : (tensor<f32>, tensor<f32>) -> tensor<f32>
    %v47 = "stablehlo.constant"() {value = dense<0x3C800000> : tensor<32xf32>} : () -> tensor<32xf32>
    %v48 = "stablehlo.reshape"(%v42) : (tensor<32x10xf32>) -> tensor<320xf32>
    %t63 = "stablehlo.iota"() {iota_dimension = 1 : i64} : () -> tensor<32x10xi32>
    %t64 = "stablehlo.broadcast_in_dim"(%arg5) {broadcast_dimensions = array<i64: 0>} : (tensor<32xi32>) -> tensor<32x10xi32>
    %t65 = "stablehlo.compare"(%t63, %t64) {comparison_direction = #stablehlo<comparison_direction EQ>} : (tensor<32x10xi32>, tensor<32x10xi32>) -> tensor<32x10xi1>
    %t66 = "stablehlo.constant"() {value = dense<0x3F800000> : tensor<32x10xf32>} : () -> tensor<32x10xf32>
    %t67 = "stablehlo.constant"() {value = dense<0x00000000> : tensor<32x10xf32>} : () -> tensor<32x10xf32>
    %t68 = "stablehlo.select"(%t65, %t66, %t67) : (tensor<32x10xi1>, tensor<32x10xf32>, tensor<32x10xf32>) -> tensor<32x10xf32>
    %t69 = "stablehlo.broadcast_in_dim"(%v47) {broadcast_dimensions = array<i64: 0>} : (tensor<32xf32>) -> tensor<32x10xf32>
    %t70 = "stablehlo.subtract"(%v42, %t68) : (tensor<32x10xf32>, tensor<32x10xf32>) -> tensor<32x10xf32>
    %v49 = "stablehlo.multiply"(%t69, %t70) : (tensor<32x10xf32>, tensor<32x10xf32>) -> tensor<32x10xf32>
    %v50 = "stablehlo.reshape"(%v49) : (tensor<32x10xf32>) -> tensor<320xf32>
    %t72 = "stablehlo.constant"() {value = dense<0x00000000> : tensor<f32>} : () -> tensor<f32>
    %t71 = "stablehlo.reduce"(%v49, %t72) ({
    ^bb0(%t73: tensor<f32>, %t74: tensor<f32>):
      %t75 = "stablehlo.add"(%t73, %t74) : (tensor<f32>, tensor<f32>) -> tensor<f32>
      "stablehlo.return"(%t75) : (tensor<f32>) -> ()
    }) {dimensions = array<i64: 0>} : (tensor<32x10xf32>, tensor<f32>) -> tensor<10xf32>
    %v51 = "stablehlo.reshape"(%t71) : (tensor<10xf32>) -> tensor<10xf32>
    %v52 = "stablehlo.reshape"(%v32) : (tensor<32x64xf32>) -> tensor<2048xf32>
    %v53 = "stablehlo.reshape"(%v49) : (tensor<32x10xf32>) -> tensor<320xf32>
    %v54 = "stablehlo.dot_general"(%v32, %v49) {dot_dimension_numbers = #stablehlo.dot<lhs_contracting_dimensions = [0], rhs_contracting_dimensions = [0]>} : (tensor<32x64xf32>, tensor<32x10xf32>) -> tensor<64x10xf32>
    %v55 = "stablehlo.reshape"(%v49) : (tensor<32x10xf32>) -> tensor<320xf32>
    %v56 = "stablehlo.slice"(%arg1) {limit_indices = array<i64: 121920>, start_indices = array<i64: 121280>, strides = array<i64: 1>} : (tensor<121930xf32>) -> tensor<640xf32>
    %v57 = "stablehlo.reshape"(%v56) : (tensor<640xf32>) -> tensor<64x10xf32>
    %v58 = "stablehlo.dot_general"(%v49, %v57) {dot_dimension_numbers = #stablehlo.dot<lhs_contracting_dimensions = [1], rhs_contracting_dimensions = [1]>} : (tensor<32x10xf32>, tensor<64x10xf32>) -> tensor<32x64xf32>
    %v59 = "stablehlo.reshape"(%v32) : (tensor<32x64xf32>) -> tensor<2048xf32>
    %v60 = "stablehlo.reshape"(%v58) : (tensor<32x64xf32>) -> tensor<2048xf32>
    %t76 = "stablehlo.constant"() {value = dense<0x00000000> : tensor<32x64xf32>} : () -> tensor<32x64xf32>
    %t77 = "stablehlo.compare"(%v32, %t76) {comparison_direction = #stablehlo<comparison_direction GT>} : (tensor<32x64xf32>, tensor<32x64xf32>) -> tensor<32x64xi1>
    %v61 = "stablehlo.select"(%t77, %v58, %t76) : (tensor<32x64xi1>, tensor<32x64xf32>, tensor<32x64xf32>) -> tensor<32x64xf32>
    %v62 = "stablehlo.reshape"(%v61) : (tensor<32x64xf32>) -> tensor<2048xf32>
    %t79 = "stablehlo.constant"() {value = dense<0x00000000> : tensor<f32>} : () -> tensor<f32>
    %t78 = "stablehlo.reduce"(%v61, %t79) ({
    ^bb0(%t80: tensor<f32>, %t81: tensor<f32>):
      %t82 = "stablehlo.add"(%t80, %t81) : (tensor<f32>, tensor<f32>) -> tensor<f32>
      "stablehlo.return"(%t82) : (tensor<f32>) -> ()
    }) {dimensions = array<i64: 0>} : (tensor<32x64xf32>, tensor<f32>) -> tensor<64xf32>
    %v63 = "stablehlo.reshape"(%t78) : (tensor<64xf32>) -> tensor<64xf32>
    %v64 = "stablehlo.reshape"(%v22) : (tensor<32x5x5x64xf32>) -> tensor<51200xf32>
    %v65 = "stablehlo.reshape"(%v64) : (tensor<51200xf32>) -> tensor<32x1600xf32>
    %v66 = "stablehlo.reshape"(%v61) : (tensor<32x64xf32>) -> tensor<2048xf32>
    %v67 = "stablehlo.dot_general"(%v65, %v61) {dot_dimension_numbers = #stablehlo.dot<lhs_contracting_dimensions = [0], rhs_contracting_dimensions = [0]>} : (tensor<32x1600xf32>, tensor<32x64xf32>) -> tensor<1600x64xf32>
    %v68 = "stablehlo.reshape"(%v61) : (tensor<32x64xf32>) -> tensor<2048xf32>
    %v69 = "stablehlo.slice"(%arg1) {limit_indices = array<i64: 121216>, start_indices = array<i64: 18816>, strides = array<i64: 1>} : (tensor<121930xf32>) -> tensor<102400xf32>
    %v70 = "stablehlo.reshape"(%v69) : (tensor<102400xf32>) -> tensor<1600x64xf32>
    %v71 = "stablehlo.dot_general"(%v61, %v70) {dot_dimension_numbers = #stablehlo.dot<lhs_contracting_dimensions = [1], rhs_contracting_dimensions = [1]>} : (tensor<32x64xf32>, tensor<1600x64xf32>) -> tensor<32x1600xf32>
    %v72 = "stablehlo.reshape"(%v22) : (tensor<32x5x5x64xf32>) -> tensor<51200xf32>
    %v73 = "stablehlo.reshape"(%v71) : (tensor<32x1600xf32>) -> tensor<51200xf32>
    %v74 = "stablehlo.reshape"(%v73) : (tensor<51200xf32>) -> tensor<32x5x5x64xf32>
    %t83 = "stablehlo.constant"() {value = dense<0x00000000> : tensor<32x5x5x64xf32>} : () -> tensor<32x5x5x64xf32>
    %t84 = "stablehlo.compare"(%v22, %t83) {comparison_direction = #stablehlo<comparison_direction GT>} : (tensor<32x5x5x64xf32>, tensor<32x5x5x64xf32>) -> tensor<32x5x5x64xi1>
    %v75 = "stablehlo.select"(%t84, %v74, %t83) : (tensor<32x5x5x64xi1>, tensor<32x5x5x64xf32>, tensor<32x5x5x64xf32>) -> tensor<32x5x5x64xf32>
    %v76 = "stablehlo.reshape"(%v20) : (tensor<32x11x11x64xf32>) -> tensor<247808xf32>
    %v77 = "stablehlo.reshape"(%v75) : (tensor<32x5x5x64xf32>) -> tensor<51200xf32>
    %t85 = "stablehlo.constant"() {value = dense<0x00000000> : tensor<f32>} : () -> tensor<f32>
    %v78 = "stablehlo.select_and_scatter"(%v20, %v75, %t85) ({
    ^bb0(%t86: tensor<f32>, %t87: tensor<f32>):
      %t88 = "stablehlo.compare"(%t86, %t87) {comparison_direction = #stablehlo<comparison_direction GE>} : (tensor<f32>, tensor<f32>) -> tensor<i1>
      "stablehlo.return"(%t88) : (tensor<i1>) -> ()
    }, {
    ^bb0(%t89: tensor<f32>, %t90: tensor<f32>):
      %t91 = "stablehlo.add"(%t89, %t90) : (tensor<f32>, tensor<f32>) -> tensor<f32>
      "stablehlo.return"(%t91) : (tensor<f32>) -> ()
    }) {padding = dense<[[0, 0], [0, 0], [0, 0], [0, 0]]> : tensor<4x2xi64>, window_dimensions = array<i64: 1, 2, 2, 1>, window_strides = array<i64: 1, 2, 2, 1>} : (tensor<32x11x11x64xf32>, tensor<32x5x5x64xf32>, tensor<f32>) -> tensor<32x11x11x64xf32>
    %v79 = "stablehlo.reshape"(%v12) : (tensor<32x13x13x32xf32>) -> tensor<173056xf32>
    %v80 = "stablehlo.reshape"(%v78) : (tensor<32x11x11x64xf32>) -> tensor<247808xf32>
    %v81 = "stablehlo.convolution"(%v12, %v78) {batch_group_count = 1 : i64, dimension_numbers = #stablehlo.conv<[f, 0, 1, b]x[i, 0, 1, o]->[0, 1, b, f]>, feature_group_count = 1 : i64, lhs_dilation = array<i64: 1, 1>, padding = dense<[[0, 0], [0, 0]]> : tensor<2x2xi64>, rhs_dilation = array<i64: 1, 1>, window_strides = array<i64: 1, 1>} : (tensor<32x13x13x32xf32>, tensor<32x11x11x64xf32>) -> tensor<3x3x32x64xf32>
    %t93 = "stablehlo.constant"() {value = dense<0x00000000> : tensor<f32>} : () -> tensor<f32>
    %t92 = "stablehlo.reduce"(%v78, %t93) ({
    ^bb0(%t94: tensor<f32>, %t95: tensor<f32>):
      %t96 = "stablehlo.add"(%t94, %t95) : (tensor<f32>, tensor<f32>) -> tensor<f32>
      "stablehlo.return"(%t96) : (tensor<f32>) -> ()
    }) {dimensions = array<i64: 0, 1, 2>} : (tensor<32x11x11x64xf32>, tensor<f32>) -> tensor<64xf32>
    %v82 = "stablehlo.reshape"(%t92) : (tensor<64xf32>) -> tensor<64xf32>
    %v83 = "stablehlo.reshape"(%v78) : (tensor<32x11x11x64xf32>) -> tensor<247808xf32>
    %v84 = "stablehlo.slice"(%arg1) {limit_indices = array<i64: 18752>, start_indices = array<i64: 320>, strides = array<i64: 1>} : (tensor<121930xf32>) -> tensor<18432xf32>
    %v85 = "stablehlo.reshape"(%v84) : (tensor<18432xf32>) -> tensor<3x3x32x64xf32>
    %t97 = "stablehlo.reverse"(%v85) {dimensions = array<i64: 0, 1>} : (tensor<3x3x32x64xf32>) -> tensor<3x3x32x64xf32>
    %v86 = "stablehlo.convolution"(%v78, %t97) {batch_group_count = 1 : i64, dimension_numbers = #stablehlo.conv<[b, 0, 1, f]x[0, 1, o, i]->[b, 0, 1, f]>, feature_group_count = 1 : i64, lhs_dilation = array<i64: 1, 1>, padding = dense<[[2, 2], [2, 2]]> : tensor<2x2xi64>, rhs_dilation = array<i64: 1, 1>, window_strides = array<i64: 1, 1>} : (tensor<32x11x11x64xf32>, tensor<3x3x32x64xf32>) -> tensor<32x13x13x32xf32>
    %v87 = "stablehlo.reshape"(%v12) : (tensor<32x13x13x32xf32>) -> tensor<173056xf32>
    %v88 = "stablehlo.reshape"(%v86) : (tensor<32x13x13x32xf32>) -> tensor<173056xf32>
    %t98 = "stablehlo.constant"() {value = dense<0x00000000> : tensor<32x13x13x32xf32>} : () -> tensor<32x13x13x32xf32>
    %t99 = "stablehlo.compare"(%v12, %t98) {comparison_direction = #stablehlo<comparison_direction GT>} : (tensor<32x13x13x32xf32>, tensor<32x13x13x32xf32>) -> tensor<32x13x13x32xi1>
    %v89 = "stablehlo.select"(%t99, %v86, %t98) : (tensor<32x13x13x32xi1>, tensor<32x13x13x32xf32>, tensor<32x13x13x32xf32>) -> tensor<32x13x13x32xf32>
    %v90 = "stablehlo.reshape"(%v10) : (tensor<32x26x26x32xf32>) -> tensor<692224xf32>
    %v91 = "stablehlo.reshape"(%v89) : (tensor<32x13x13x32xf32>) -> tensor<173056xf32>
    %t100 = "stablehlo.constant"() {value = dense<0x00000000> : tensor<f32>} : () -> tensor<f32>
    %v92 = "stablehlo.select_and_scatter"(%v10, %v89, %t100) ({
    ^bb0(%t101: tensor<f32>, %t102: tensor<f32>):
      %t103 = "stablehlo.compare"(%t101, %t102) {comparison_direction = #stablehlo<comparison_direction GE>} : (tensor<f32>, tensor<f32>) -> tensor<i1>
      "stablehlo.return"(%t103) : (tensor<i1>) -> ()
    }, {
    ^bb0(%t104: tensor<f32>, %t105: tensor<f32>):
      %t106 = "stablehlo.add"(%t104, %t105) : (tensor<f32>, tensor<f32>) -> tensor<f32>
      "stablehlo.return"(%t106) : (tensor<f32>) -> ()
    }) {padding = dense<[[0, 0], [0, 0], [0, 0], [0, 0]]> : tensor<4x2xi64>, window_dimensions = array<i64: 1, 2, 2, 1>, window_strides = array<i64: 1, 2, 2, 1>} : (tensor<32x26x26x32xf32>, tensor<32x13x13x32xf32>, tensor<f32>) -> tensor<32x26x26x32xf32>
    %v93 = "stablehlo.reshape"(%arg4) : (tensor<32x28x28x1xf32>) -> tensor<25088xf32>
    %v94 = "stablehlo.reshape"(%v92) : (tensor<32x26x26x32xf32>) -> tensor<692224xf32>
    %v95 = "stablehlo.convolution"(%arg4, %v92) {batch_group_count = 1 : i64, dimension_numbers = #stablehlo.conv<[f, 0, 1, b]x[i, 0, 1, o]->[0, 1, b, f]>, feature_group_count = 1 : i64, lhs_dilation = array<i64: 1, 1>, padding = dense<[[0, 0], [0, 0]]> : tensor<2x2xi64>, rhs_dilation = array<i64: 1, 1>, window_strides = array<i64: 1, 1>} : (tensor<32x28x28x1xf32>, tensor<32x26x26x32xf32>) -> tensor<3x3x1x32xf32>
    %t108 = "stablehlo.constant"() {value = dense<0x00000000> : tensor<f32>} : () -> tensor<f32>
    %t107 = "stablehlo.reduce"(%v92, %t108) ({
    ^bb0(%t109: tensor<f32>, %t110: tensor<f32>):
      %t111 = "stablehlo.add"(%t109, %t110) : (tensor<f32>, tensor<f32>) -> tensor<f32>
      "stablehlo.return"(%t111) : (tensor<f32>) -> ()
    }) {dimensions = array<i64: 0, 1, 2>} : (tensor<32x26x26x32xf32>, tensor<f32>) -> tensor<32xf32>
    %v96 = "stablehlo.reshape"(%t107) : (tensor<32xf32>) -> tensor<32xf32>
    %v97 = "stablehlo.reshape"(%v95) : (tensor<3x3x1x32xf32>) -> tensor<288xf32>
    %v98 = "stablehlo.reshape"(%v81) : (tensor<3x3x32x64xf32>) -> tensor<18432xf32>
    %v99 = "stablehlo.reshape"(%v67) : (tensor<1600x64xf32>) -> tensor<102400xf32>
    %v100 = "stablehlo.reshape"(%v54) : (tensor<64x10xf32>) -> tensor<640xf32>
    %v101 = "stablehlo.concatenate"(%v97, %v96, %v98, %v82, %v99, %v63, %v100, %v51) {dimension = 0 : i64} : (tensor<288xf32>, tensor<32xf32>, tensor<18432xf32>, tensor<64xf32>, tensor<102400xf32>, tensor<64xf32>, tensor<640xf32>, tensor<10xf32>) -> tensor<121930xf32>
    %v102 = "stablehlo.all_reduce"(%v101) ({
    ^bb0(%t112: tensor<f32>, %t113: tensor<f32>):
      %t114 = "stablehlo.add"(%t112, %t113) : (tensor<f32>, tensor<f32>) -> tensor<f32>
      "stablehlo.return"(%t114) : (tensor<f32>) -> ()
    }) {replica_groups = dense<[[0, 1]]> : tensor<1x2xi64>} : (tensor<121930xf32>) -> tensor<121930xf32>
    %t115 = "stablehlo.slice"(%scalars) {limit_indices = array<i64: 1>, start_indices = array<i64: 0>, strides = array<i64: 1>} : (tensor<5xf32>) -> tensor<1xf32>
    %v105 = "stablehlo.reshape"(%t115) : (tensor<1xf32>) -> tensor<f32>
    %v106 = "stablehlo.broadcast_in_dim"(%v105) {broadcast_dimensions = array<i64>} : (tensor<f32>) -> tensor<121930xf32>
    %v107 = "stablehlo.multiply"(%v102, %v106) : (tensor<121930xf32>, tensor<121930xf32>) -> tensor<121930xf32>
    %v108 = "stablehlo.subtract"(%v107, %arg2) : (tensor<121930xf32>, tensor<121930xf32>) -> tensor<121930xf32>
    %t116 = "stablehlo.slice"(%scalars) {limit_indices = array<i64: 2>, start_indices = array<i64: 1>, strides = array<i64: 1>} : (tensor<5xf32>) -> tensor<1xf32>
    %v109 = "stablehlo.reshape"(%t116) : (tensor<1xf32>) -> tensor<f32>
    %v110 = "stablehlo.broadcast_in_dim"(%v109) {broadcast_dimensions = array<i64>} : (tensor<f32>) -> tensor<121930xf32>
    %v111 = "stablehlo.multiply"(%v108, %v110) : (tensor<121930xf32>, tensor<121930xf32>) -> tensor<121930xf32>
    %v112 = "stablehlo.add"(%arg2, %v111) : (tensor<121930xf32>, tensor<121930xf32>) -> tensor<121930xf32>
    %v113 = "stablehlo.multiply"(%v107, %v107) : (tensor<121930xf32>, tensor<121930xf32>) -> tensor<121930xf32>
    %v114 = "stablehlo.subtract"(%v113, %arg3) : (tensor<121930xf32>, tensor<121930xf32>) -> tensor<121930xf32>
    %t117 = "stablehlo.slice"(%scalars) {limit_indices = array<i64: 3>, start_indices = array<i64: 2>, strides = array<i64: 1>} : (tensor<5xf32>) -> tensor<1xf32>
    %v115 = "stablehlo.reshape"(%t117) : (tensor<1xf32>) -> tensor<f32>
    %v116 = "stablehlo.broadcast_in_dim"(%v115) {broadcast_dimensions = array<i64>} : (tensor<f32>) -> tensor<121930xf32>
    %v117 = "stablehlo.multiply"(%v114, %v116) : (tensor<121930xf32>, tensor<121930xf32>) -> tensor<121930xf32>
    %v118 = "stablehlo.add"(%arg3, %v117) : (tensor<121930xf32>, tensor<121930xf32>) -> tensor<121930xf32>
    %v119 = "stablehlo.sqrt"(%v118) : (tensor<121930xf32>) -> tensor<121930xf32>
    %t118 = "stablehlo.slice"(%scalars) {limit_indices = array<i64: 4>, start_indices = array<i64: 3>, strides = array<i64: 1>} : (tensor<5xf32>) -> tensor<1xf32>
    %v120 = "stablehlo.reshape"(%t118) : (tensor<1xf32>) -> tensor<f32>
    %v121 = "stablehlo.broadcast_in_dim"(%v120) {broadcast_dimensions = array<i64>} : (tensor<f32>) -> tensor<121930xf32>
    %v122 = "stablehlo.add"(%v119, %v121) : (tensor<121930xf32>, tensor<121930xf32>) -> tensor<121930xf32>
    %t119 = "stablehlo.slice"(%scalars) {limit_indices = array<i64: 5>, start_indices = array<i64: 4>, strides = array<i64: 1>} : (tensor<5xf32>) -> tensor<1xf32>
    %v123 = "stablehlo.reshape"(%t119) : (tensor<1xf32>) -> tensor<f32>
    %v124 = "stablehlo.broadcast_in_dim"(%v123) {broadcast_dimensions = array<i64>} : (tensor<f32>) -> tensor<121930xf32>
    %v125 = "stablehlo.multiply"(%v112, %v124) : (tensor<121930xf32>, tensor<121930xf32>) -> tensor<121930xf32>
    %v126 = "stablehlo.divide"(%v125, %v122) : (tensor<121930xf32>, tensor<121930xf32>) -> tensor<121930xf32>
    %v127 = "stablehlo.subtract"(%arg1, %v126) : (tensor<121930xf32>, tensor<121930xf32>) -> tensor<121930xf32>
    %v128 = "stablehlo.reshape"(%v46) : (tensor<f32>) -> tensor<1xf32>
    "func.return"(%v127, %v102, %v118, %v112, %v46) : (tensor<121930xf32>, tensor<121930xf32>, tensor<121930xf32>, tensor<121930xf32>, tensor<f32>) -> ()
  }
}
