/* The example of docs/c_api.md, compiled by the build (tools/check_doc_examples.py checks that
   the text between the doc markers is the document's, and that this file has its includes). */
#include <stdio.h>
#include <tvc/c_api.h>

int classify(const float *pixels);

int classify(const float *pixels) {
  /* [doc] */
  tvc_model *model = NULL;
  tvc_tensor *input = NULL, *logits = NULL;
  int64_t shape[4] = {1, 3, 224, 224};
  int status = tvc_model_create("resnet18", 0, &model); /* 1000 classes */
  if (status == TVC_OK) status = tvc_model_load_weights(model, "DEFAULT");
  if (status == TVC_OK) status = tvc_tensor_from_data(pixels, shape, 4, &input);
  if (status == TVC_OK) status = tvc_model_forward(model, input, &logits);
  if (status != TVC_OK) fprintf(stderr, "tvc: %s\n", tvc_last_error());
  /* tvc_tensor_shape(logits) = {1, 1000}; tvc_tensor_data(logits) = the 1000 logits */
  tvc_tensor_free(logits);
  tvc_tensor_free(input);
  tvc_model_free(model);
  /* [end doc] */
  return status;
}
