/* device.h - what tensor/device.c and tensor/device_nn.c share: the device
 * tensors' helpers (not part of the API; tensor.h is). */
#ifndef TAGALLOC_TENSOR_DEVICE_H
#define TAGALLOC_TENSOR_DEVICE_H

#include "internal.h"
#include "gpu.h"

/* The error for a failed backend call (TENSOR_EINVAL, naming the backend
 * and its last_error()). */
tensor_status _tdev_fail(const char *op, const gpu_backend *b, gpu_status st);
/* A contiguous tensor of dt and shape on p, its data uninitialised. */
tensor *_tdev_out(const char *op, gpu_pool *p, tensor_dtype dt, int ndim, const int64_t *shape);
/* The device of a and b (b may be NULL): both on one device, else an error
 * (NULL). */
gpu_pool *_tdev_same(const char *op, const tensor *a, const tensor *b);
/* A contiguous copy of a on its device (any 4-byte dtype). */
tensor *_tdev_clone(const char *op, const tensor *a);
/* t itself when contiguous f32, else a contiguous copy (*copy, the
 * caller's to free); NULL with an error for another dtype. */
const tensor *_tdev_borrow(const char *op, const tensor *t, tensor **copy);
/* out, or NULL (out freed, the error set) when st is a failure. */
tensor *_tdev_finish(const char *op, const gpu_backend *B, gpu_status st, tensor *out);

/* device_nn.c: the ops of tensor/linalg.c, nn.c and optim.c on a device. */
tensor_status _tdev_gemm(const char *op, tensor *out, const tensor *a, int ta, const tensor *b, int tb, float alpha,
                         float beta);
tensor *_tdev_matmul_t(const char *op, const tensor *a, int ta, const tensor *b, int tb);
tensor_status _tdev_sum_add(const char *op, tensor *acc, const tensor *a, int axis);
tensor *_tdev_argmax(const char *op, const tensor *a, int axis, int keepdim);
tensor_status _tdev_item(const char *op, const tensor *t, float *v);
tensor *_tdev_conv2d(const char *op, const tensor *x, const tensor *w, const tensor *bias, int stride, int pad);
tensor *_tdev_conv2d_grad(const char *op, int which, const tensor *dy, const tensor *other, int ndim,
                          const int64_t *shape, int stride, int pad);
tensor *_tdev_pool(const char *op, bool max, const tensor *x, int k, int stride, tensor **argmax);
tensor *_tdev_pool_grad(const char *op, const tensor *dy, const tensor *argmax, int k, int stride, int ndim,
                        const int64_t *x_shape);
tensor *_tdev_softmax(const char *op, const tensor *x, int axis);
tensor *_tdev_softmax_grad(const char *op, const tensor *dy, const tensor *y, int axis);
tensor *_tdev_xent(const char *op, const tensor *logits, const tensor *labels, bool grad);
tensor *_tdev_embedding(const char *op, const tensor *weight, const tensor *indices);
tensor_status _tdev_embedding_grad(const char *op, tensor *dweight, const tensor *dout, const tensor *indices);
tensor_status _tdev_sgd(const char *op, tensor *p, const tensor *g, tensor *buf, float lr, float momentum,
                        float weight_decay, int first);
tensor_status _tdev_adam(const char *op, tensor *p, const tensor *g, tensor *m, tensor *v, float lr, float beta1,
                         float beta2, float eps, float weight_decay, int64_t t);

#endif
