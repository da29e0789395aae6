// A program written against the header tfcompile generated for
//
//   tf_library(name = "mlp", graph = "mlp.pb", config = "mlp.config.pbtxt", cpp_class = "example::Mlp")
//
// built against aotc's library instead. Two things changed: the include below (tfcompile's header was
// mlp.h; aotc's mlp.h is the C API, and the class is in mlp.hpp) and the build rule (Makefile).
#include <algorithm>
#include <cstdio>
#include <iostream>

#include "mlp.hpp"  // was: #include "mlp.h" (tfcompile)

int main() {
  example::Mlp mlp;  // owns its argument, result and temp buffers

  // The input make_model.py gave TensorFlow for expected.txt.
  float x[2 * 8];
  for (int i = 0; i < 2 * 8; ++i) x[i] = static_cast<float>((7 * i) % 11) / 8.0f - 0.5f;

  // Copy into the argument buffer the object owns, and run.
  std::copy(x, x + mlp.arg0_count(), mlp.arg0_data());
  if (!mlp.Run()) {
    std::cerr << "Run failed: " << mlp.error_msg() << std::endl;
    return 1;
  }
  for (int r = 0; r < 2; ++r) {
    for (int c = 0; c < 4; ++c) std::printf("probs[%d][%d] = %.6f\n", r, c, mlp.result0(r, c));
  }

  // The same by name, without the copy: point the argument at the caller's buffer.
  float first[2 * 4];
  std::copy(mlp.result_probs_data(), mlp.result_probs_data() + mlp.result_probs_count(), first);
  mlp.set_arg_x_data(x);
  if (!mlp.Run()) {
    std::cerr << "Run failed: " << mlp.error_msg() << std::endl;
    return 1;
  }
  const int probs = mlp.LookupResultIndex("probs");
  if (mlp.LookupArgIndex("x") != 0 || probs != 0) {
    std::cerr << "unexpected argument or result index" << std::endl;
    return 1;
  }
  const float *again = static_cast<const float *>(mlp.result_data(probs));
  if (!std::equal(first, first + 2 * 4, again)) {
    std::cerr << "the second run differs from the first" << std::endl;
    return 1;
  }
  std::printf("%s: %zu argument(s), %zu result(s), runs agree\n", "example::Mlp", example::Mlp::kNumArgs,
              example::Mlp::kNumResults);
  return 0;
}
