/* Trains softmax regression on handwritten digits with the step aotc compiled, then serves it.
 *
 * digits_train_step runs one SGD step (forward, loss, gradients, update) in place on the state
 * buffer; digits_run reads the trained parameters from the same buffer. Nothing here allocates:
 * the state and the workspace are static arrays. Build and run with `make run`. */
#include <stdio.h>
#include <stdlib.h>

#include "digits.h"

#ifndef DATA_DIR
#define DATA_DIR "build"
#endif

#define BATCH 100
#define PIXELS 64
#define CLASSES 10
#define TRAIN 1500
#define TEST 200
#define EPOCHS 20

static float train_x[TRAIN * PIXELS], test_x[TEST * PIXELS], probs[BATCH * CLASSES];
static int64_t train_y[TRAIN], test_y[TEST];
static _Alignas(64) unsigned char state[DIGITS_STATE_BYTES];
static _Alignas(64) unsigned char workspace[DIGITS_WORKSPACE_BYTES + 1];

static void load(const char *file, void *dst, size_t bytes) {
  char path[512];
  snprintf(path, sizeof path, "%s/%s", DATA_DIR, file);
  FILE *f = fopen(path, "rb");
  if (!f || fread(dst, 1, bytes, f) != bytes) {
    fprintf(stderr, "cannot read %s\n", path);
    exit(1);
  }
  fclose(f);
}

static void check(int status, const char *what) {
  if (status != DIGITS_OK) {
    fprintf(stderr, "%s: %s\n", what, digits_status_name(status));
    exit(1);
  }
}

int main(void) {
  load("train_x.bin", train_x, sizeof train_x);
  load("train_y.bin", train_y, sizeof train_y);
  load("test_x.bin", test_x, sizeof test_x);
  load("test_y.bin", test_y, sizeof test_y);

  check(digits_state_init(state), "digits_state_init"); /* W and b from the model: zeros */
  for (int epoch = 0; epoch < EPOCHS; epoch++) {
    float loss = 0;
    for (int b = 0; b < TRAIN / BATCH; b++)
      check(digits_train_step(train_x + b * BATCH * PIXELS, train_y + b * BATCH, &loss, state, workspace),
            "digits_train_step");
    if (epoch % 5 == 4) printf("epoch %d: loss %.4f\n", epoch + 1, loss);
  }
  printf("steps: %lld\n", (long long)*digits_state_step_data(state));

  int correct = 0;
  for (int b = 0; b < TEST / BATCH; b++) {
    check(digits_run(test_x + b * BATCH * PIXELS, probs, state, workspace), "digits_run");
    for (int i = 0; i < BATCH; i++) {
      int best = 0;
      for (int c = 1; c < CLASSES; c++)
        if (probs[i * CLASSES + c] > probs[i * CLASSES + best]) best = c;
      correct += best == test_y[b * BATCH + i];
    }
  }
  printf("held-out accuracy: %.3f\n", (double)correct / TEST);
  return 0;
}
