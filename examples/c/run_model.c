/* A torchvision backbone from C through tvc's C API (tvc/c_api.h): creates MODEL with
 * NUM_CLASSES outputs, loads WEIGHTS (a .pth written by torch.save, a .safetensors file or a
 * torchvision tag such as DEFAULT), runs it on N images of H x W read from INPUT (float32,
 * row-major (N, 3, H, W), already normalised), writes the logits to OUTPUT (float32, (N,
 * NUM_CLASSES)) and prints each image's best class.
 *
 *   cc -std=c11 run_model.c $(pkg-config --cflags --static --libs tvc-c) -o run_model
 *   ./run_model resnet18 10 resnet18_10.pth images.f32 2 224 224 logits.f32 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <tvc/c_api.h>

/* Reads exactly count floats from path into values; 0 on success. */
static int read_floats(const char *path, float *values, int64_t count) {
  FILE *file = fopen(path, "rb");
  if (!file) return -1;
  size_t got = fread(values, sizeof(float), (size_t)count, file);
  int extra = fgetc(file) != EOF;
  fclose(file);
  return got == (size_t)count && !extra ? 0 : -1;
}

static int write_floats(const char *path, const float *values, int64_t count) {
  FILE *file = fopen(path, "wb");
  if (!file) return -1;
  size_t put = fwrite(values, sizeof(float), (size_t)count, file);
  return fclose(file) == 0 && put == (size_t)count ? 0 : -1;
}

int main(int argc, char **argv) {
  if (argc != 9) {
    fprintf(stderr, "usage: %s MODEL NUM_CLASSES WEIGHTS INPUT N H W OUTPUT\n", argv[0]);
    return 2;
  }
  int64_t shape[4] = {atoll(argv[5]), 3, atoll(argv[6]), atoll(argv[7])};
  if (shape[0] < 1 || shape[2] < 1 || shape[3] < 1 || shape[2] > 4096 || shape[3] > 4096 || shape[0] > 1024) {
    fprintf(stderr, "N, H and W must be positive (H, W <= 4096, N <= 1024)\n");
    return 2;
  }
  int64_t count = shape[0] * shape[1] * shape[2] * shape[3];
  float *pixels = malloc((size_t)count * sizeof(float));
  if (!pixels || read_floats(argv[4], pixels, count) != 0) {
    fprintf(stderr, "cannot read %lld float32 values from %s\n", (long long)count, argv[4]);
    free(pixels);
    return 1;
  }

  tvc_model *model = NULL;
  tvc_tensor *input = NULL, *logits = NULL;
  int status = tvc_model_create(argv[1], atoll(argv[2]), &model);
  if (status == TVC_OK) status = tvc_model_load_weights(model, argv[3]);
  if (status == TVC_OK) status = tvc_tensor_from_data(pixels, shape, 4, &input);
  if (status == TVC_OK) status = tvc_model_forward(model, input, &logits);
  free(pixels);
  if (status == TVC_OK) {
    const int64_t *out_shape = tvc_tensor_shape(logits);
    const float *values = tvc_tensor_data(logits);
    for (int64_t n = 0; n < out_shape[0]; ++n) {
      int64_t best = 0;
      for (int64_t c = 1; c < out_shape[1]; ++c)
        if (values[n * out_shape[1] + c] > values[n * out_shape[1] + best]) best = c;
      printf("image %lld: class %lld (logit %.4f)\n", (long long)n, (long long)best, values[n * out_shape[1] + best]);
    }
    if (write_floats(argv[8], values, tvc_tensor_numel(logits)) != 0) {
      fprintf(stderr, "cannot write %s\n", argv[8]);
      status = -1;
    }
  } else {
    fprintf(stderr, "tvc: %s\n", tvc_last_error());
  }
  tvc_tensor_free(logits);
  tvc_tensor_free(input);
  tvc_model_free(model);
  printf("tvc %s\n", tvc_version());
  return status == TVC_OK ? 0 : 1;
}
