/*
 * npu_devices_int.h -- the device discovery's private pieces (npu_devices.c,
 * npu_xrt.c): the kernel's DRM and amdxdna definitions it needs, and the
 * table of system calls the tests replace to fake a device.
 */
#ifndef D3STREAM_NPU_DEVICES_INT_H
#define D3STREAM_NPU_DEVICES_INT_H

#include "npu.h"

#include <stdint.h>
#include <sys/ioctl.h>
#include <sys/resource.h>

/* ---- DRM and amdxdna uapi ----------------------------------------------
 *
 * The system's headers when it has them (a newer linux-libc-dev or
 * libdrm-dev); Debian 12 has neither (linux-libc-dev 6.1 ships no drm/, and
 * amdxdna arrived in Linux 6.14), so the few definitions discovery uses are
 * carried here, copied from the kernel's uapi headers:
 *  - include/uapi/drm/drm.h: struct drm_version, DRM_IOCTL_BASE,
 *    DRM_IOCTL_VERSION, DRM_COMMAND_BASE (unchanged for decades);
 *  - include/uapi/drm/amdxdna_accel.h as in torvalds/linux at commit
 *    03c318a0af96 (and, byte for byte in these parts, a 6.16-rc6 tree):
 *    DRM_AMDXDNA_GET_INFO (the 8th driver ioctl, 7), struct
 *    amdxdna_drm_get_info, the GET_INFO parameters QUERY_AIE_METADATA (1),
 *    QUERY_AIE_VERSION (2) and QUERY_FIRMWARE_VERSION (8), and their
 *    structs.
 * The asserts below pin the sizes and the ioctl numbers (LP64), so a
 * system header that disagreed would not build. */
#if __has_include(<drm/drm.h>)
#include <drm/drm.h>
#else
struct drm_version {
    int    version_major;      /* Major version */
    int    version_minor;      /* Minor version */
    int    version_patchlevel; /* Patch level */
    size_t name_len;           /* Length of name buffer (__kernel_size_t) */
    char  *name;               /* Name of driver */
    size_t date_len;           /* Length of date buffer */
    char  *date;               /* User-space buffer to hold date */
    size_t desc_len;           /* Length of desc buffer */
    char  *desc;               /* User-space buffer to hold desc */
};
#define DRM_IOCTL_BASE     'd'
#define DRM_IOWR(nr, type) _IOWR(DRM_IOCTL_BASE, nr, type)
#define DRM_IOCTL_VERSION  DRM_IOWR(0x00, struct drm_version)
#define DRM_COMMAND_BASE   0x40
#endif

#if __has_include(<drm/amdxdna_accel.h>)
#include <drm/amdxdna_accel.h>
#else
#define DRM_AMDXDNA_GET_INFO               7
#define DRM_AMDXDNA_QUERY_AIE_METADATA     1
#define DRM_AMDXDNA_QUERY_AIE_VERSION      2
#define DRM_AMDXDNA_QUERY_FIRMWARE_VERSION 8

struct amdxdna_drm_query_aie_version {
    uint32_t major; /* out */
    uint32_t minor; /* out */
};

struct amdxdna_drm_query_aie_tile_metadata {
    uint16_t row_count;
    uint16_t row_start;
    uint16_t dma_channel_count;
    uint16_t lock_count;
    uint16_t event_reg_count;
    uint16_t pad[3];
};

struct amdxdna_drm_query_aie_metadata {
    uint32_t                                   col_size;
    uint16_t                                   cols;
    uint16_t                                   rows;
    struct amdxdna_drm_query_aie_version       version;
    struct amdxdna_drm_query_aie_tile_metadata core;
    struct amdxdna_drm_query_aie_tile_metadata mem;
    struct amdxdna_drm_query_aie_tile_metadata shim;
};

struct amdxdna_drm_query_firmware_version {
    uint32_t major; /* out */
    uint32_t minor; /* out */
    uint32_t patch; /* out */
    uint32_t build; /* out */
};

struct amdxdna_drm_get_info {
    uint32_t param;       /* in */
    uint32_t buffer_size; /* in/out */
    uint64_t buffer;      /* in/out: a user pointer */
};

#define DRM_IOCTL_AMDXDNA_GET_INFO                                                                 \
    DRM_IOWR(DRM_COMMAND_BASE + DRM_AMDXDNA_GET_INFO, struct amdxdna_drm_get_info)
#endif

_Static_assert(sizeof(struct drm_version) == 64, "struct drm_version is 64 bytes on LP64");
_Static_assert(DRM_IOCTL_VERSION == 0xC0406400u, "DRM_IOCTL_VERSION");
_Static_assert(sizeof(struct amdxdna_drm_get_info) == 16, "struct amdxdna_drm_get_info");
_Static_assert(DRM_IOCTL_AMDXDNA_GET_INFO == 0xC0106447u, "DRM_IOCTL_AMDXDNA_GET_INFO");
_Static_assert(sizeof(struct amdxdna_drm_query_aie_version) == 8, "query_aie_version");
_Static_assert(sizeof(struct amdxdna_drm_query_aie_metadata) == 64, "query_aie_metadata");
_Static_assert(sizeof(struct amdxdna_drm_query_firmware_version) == 16, "query_firmware_version");

/* ---- the calls discovery makes -------------------------------------------
 *
 * Everything that would need a device, a driver or XRT goes through this
 * table, so that the tests can answer for them: with D3_TEST_DEVROOT (a
 * directory standing for / when discovery reads /dev and /sys, which only
 * the tests set) they describe a machine's device tree in files, and with
 * npu_devices_test_sys what opening a node, its ioctls, getrlimit and
 * dlopen answer. */
typedef struct npu_sys {
    int (*open)(const char *path, int flags);
    int (*ioctl)(int fd, unsigned long request, void *arg);
    int (*close)(int fd);
    int (*getrlimit)(int resource, struct rlimit *rl);
    void *(*dlopen)(const char *file, int mode);
    void *(*dlsym)(void *handle, const char *name);
    int (*dlclose)(void *handle);
    const char *(*dlerror)(void);
} npu_sys_t;

/* The table in use: the system's calls unless a test replaced them. */
const npu_sys_t *npu_sys(void);

/* Test hook: discovery makes sys's calls from now on (NULL: the system's
 * again); sys must outlive the calls. Not thread-safe: a test sets it
 * before scanning. The product never calls it. */
void npu_devices_test_sys(const npu_sys_t *sys);

/* XRT's part of a scan (npu_xrt.c): x filled, reason included. */
void npu_xrt_scan(npu_xrt_t *x);

/* The firmware an XDNA backend would want (npu_devices.c): 1.1.0.0, the
 * line of the firmware the XDNA stack's Linux set-up installs today (a
 * validated FastFlowLM baseline: firmware 1.1.2.65, XRT 2.25). Older
 * firmware is not known to run D3-Nano-NPU2's seed runtime; a project
 * choice, stated in the reason, not a rule of the driver's. */
#define NPU_XDNA_FW_MIN_MAJOR 1
#define NPU_XDNA_FW_MIN_MINOR 1

#endif /* D3STREAM_NPU_DEVICES_INT_H */
