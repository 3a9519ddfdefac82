// CHUNKATTN_HOST_DEVICE marks functions that nvcc compiles for both the host
// and the device and every other compiler for the host alone, so index and
// hash arithmetic has one definition that the CPU tests check.
#ifndef CHUNKATTN_BASE_HOST_DEVICE_H_
#define CHUNKATTN_BASE_HOST_DEVICE_H_

#if defined(__CUDACC__)
#define CHUNKATTN_HOST_DEVICE __host__ __device__
#else
#define CHUNKATTN_HOST_DEVICE
#endif

#endif  // CHUNKATTN_BASE_HOST_DEVICE_H_
