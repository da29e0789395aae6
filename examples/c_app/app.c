/*
 * Minimal C program using an aotc-compiled model.
 *
 * The model (mlp.onnx from examples/mnist/make_models.py) maps one 28x28
 * image, flattened to 784 floats, to 10 logits. aotc turned it into mlp.h
 * and libmlp.a; there is no runtime to initialise and nothing allocates
 * behind our back: the caller owns the inputs, the outputs and the scratch
 * workspace.
 *
 * Output format (parsed by tests/test_examples.py):
 *   argmax: <class>
 *   logit[<i>]: <value>      (10 lines, %.9g)
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "mlp.h"

#define IMAGE_SIZE 784
#define NUM_CLASSES 10
#define WORKSPACE_ALIGN 64

/* aligned_alloc wants a size that is a multiple of the alignment (and > 0). */
static size_t round_up(size_t n, size_t align) {
    if (n == 0) {
        return align;
    }
    return (n + align - 1) / align * align;
}

/* A deterministic "image": a smooth pattern in [0, 1], the same one the
 * tests reproduce in Python. */
static void fill_input(float *x, size_t n) {
    for (size_t i = 0; i < n; ++i) {
        x[i] = (float)((i * 37u) % 256u) / 255.0f;
    }
}

int main(void) {
    static float input[IMAGE_SIZE];
    static float logits[NUM_CLASSES];

    void *workspace = aligned_alloc(WORKSPACE_ALIGN, round_up(MLP_WORKSPACE_BYTES, WORKSPACE_ALIGN));
    if (workspace == NULL) {
        fprintf(stderr, "app: cannot allocate %zu bytes of workspace\n", (size_t)MLP_WORKSPACE_BYTES);
        return 1;
    }
    if (mlp_workspace_size() > round_up(MLP_WORKSPACE_BYTES, WORKSPACE_ALIGN)) {
        fprintf(stderr, "app: mlp_workspace_size() disagrees with MLP_WORKSPACE_BYTES\n");
        free(workspace);
        return 1;
    }

    fill_input(input, IMAGE_SIZE);
    memset(logits, 0, sizeof logits);

    int rc = mlp_run(input, logits, workspace);
    free(workspace);
    if (rc != 0) {
        fprintf(stderr, "app: mlp_run failed with code %d\n", rc);
        return 1;
    }

    int best = 0;
    for (int i = 1; i < NUM_CLASSES; ++i) {
        if (logits[i] > logits[best]) {
            best = i;
        }
    }
    printf("argmax: %d\n", best);
    for (int i = 0; i < NUM_CLASSES; ++i) {
        printf("logit[%d]: %.9g\n", i, (double)logits[i]);
        if (!isfinite(logits[i])) {
            fprintf(stderr, "app: logit %d is not finite\n", i);
            return 1;
        }
    }
    return 0;
}
