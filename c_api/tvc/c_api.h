/* tvc's C API: create a torchvision backbone, load its weights, run it (C11 and C++; library
 * tvc-c, pkg-config tvc-c). Documented in docs/c_api.md.
 *
 *   tvc_model *model;
 *   tvc_tensor *input, *logits;
 *   int64_t shape[4] = {1, 3, 224, 224};
 *   if (tvc_model_create("resnet18", 0, &model) != 0 ||
 *       tvc_model_load_weights(model, "resnet18-f37072fd.pth") != 0 ||
 *       tvc_tensor_from_data(pixels, shape, 4, &input) != 0 ||
 *       tvc_model_forward(model, input, &logits) != 0)
 *     fprintf(stderr, "tvc: %s\n", tvc_last_error());
 *
 * Conventions: every call that can fail returns an int, TVC_OK (0) on success and one of the
 * TVC_ERROR_* codes otherwise, with the message in tvc_last_error(); no C++ exception crosses
 * this API. A failed call changes none of its handles and sets no output (*out stays as it was),
 * so the handles stay usable. Every handle a call returns is the caller's, freed with its _free
 * function (which accepts NULL). Tensors are float32 and row-major (C order).
 *
 * Threads: every function may be called from any thread. One model may run tvc_model_forward
 * from several threads at once; tvc_model_load_weights and tvc_model_free must not overlap
 * other calls on the same model. Tensors are immutable once made. */
#ifndef TVC_C_API_H
#define TVC_C_API_H

#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* Status codes. */
#define TVC_OK 0
#define TVC_ERROR_INVALID_ARGUMENT 1 /* a NULL pointer, a negative size, an unknown name, a bad shape */
#define TVC_ERROR_FAILED 2           /* the operation failed: a missing or malformed file, ... */
#define TVC_ERROR_OUT_OF_MEMORY 3

/* Opaque handles. */
typedef struct tvc_model tvc_model;
typedef struct tvc_tensor tvc_tensor;

/* The library's version, "MAJOR.MINOR.PATCH" (static storage). */
const char *tvc_version(void);

/* The message of the calling thread's last failed call, or "" when none has failed (never NULL;
 * valid until this thread's next failing call). */
const char *tvc_last_error(void);

/* Threads used by the kernels of every thread's calls from now on (n >= 1). */
int tvc_set_num_threads(int n);

/* A new model `name` (a torchvision name: "resnet18", "efficientnet_b0", "vit_b_16", ...) with
 * random weights, in eval mode. num_classes: the classifier's outputs; 0 for torchvision's
 * default (1000). */
int tvc_model_create(const char *name, int64_t num_classes, tvc_model **out);

/* Loads a weight file (.pth written by torch.save, or .safetensors) or a torchvision tag
 * ("DEFAULT", "IMAGENET1K_V1"; the file is looked up as tvc's CLI does) into model. Every tensor
 * must fit the model exactly (a classifier of another class count is an error naming it); on
 * failure the model is unchanged. */
int tvc_model_load_weights(tvc_model *model, const char *path);

/* The model's output for input, in eval mode without autograd: input (N, 3, H, W) images
 * (normalised as the weights expect), *out (N, num_classes) logits. */
int tvc_model_forward(tvc_model *model, const tvc_tensor *input, tvc_tensor **out);

void tvc_model_free(tvc_model *model);

/* A new tensor holding a copy of the float32 values at data, shaped shape[0] x ... x
 * shape[ndim - 1] (0 <= ndim <= 8, every size >= 0; data may be NULL when the tensor is empty). */
int tvc_tensor_from_data(const float *data, const int64_t *shape, int ndim, tvc_tensor **out);

/* Number of dims, the sizes (ndim of them, valid while the tensor lives), the element count and
 * the values (float32, row-major, valid while the tensor lives). Given NULL these return 0 or
 * NULL. */
int tvc_tensor_ndim(const tvc_tensor *tensor);
const int64_t *tvc_tensor_shape(const tvc_tensor *tensor);
int64_t tvc_tensor_numel(const tvc_tensor *tensor);
const float *tvc_tensor_data(const tvc_tensor *tensor);

void tvc_tensor_free(tvc_tensor *tensor);

#ifdef __cplusplus
} /* extern "C" */
#endif

#endif /* TVC_C_API_H */
