/*
 * test_npu_devices.c -- NPU and XRT discovery on machines without either:
 * a fake device tree (D3_TEST_DEVROOT: files standing for /dev/accel and
 * /sys/class/accel) and the answers of open, the DRM and amdxdna ioctls,
 * getrlimit and dlopen given through the probe table (npu_devices_test_sys).
 * Each case checks the finding and that its reason names what an operator
 * must know: no node, another vendor's accelerator, XDNA1, XDNA2 ready,
 * permission denied, old firmware, the firmware from sysfs, XRT missing,
 * XRT too old (and without a version), memlock limited.
 */
#include <criterion/criterion.h>
#include <dlfcn.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "npu.h"
#include "npu_devices_int.h"
#include "test_util.h"

/* ------------------------------------------------------------ the fake device */

/* What one node answers. */
typedef struct fake_node {
    const char *driver;     /* DRM_IOCTL_VERSION's name; NULL: the ioctl fails (ENOTTY) */
    int         open_errno; /* open fails with it; 0: opens */
    bool        info;       /* answers AIE version and metadata */
    bool        fw_ioctl;   /* answers QUERY_FIRMWARE_VERSION */
    unsigned    fw[4];
} fake_node_t;

/* What XRT's dlopen answers. */
typedef enum fake_xrt { XRT_MISSING, XRT_NO_VERSION, XRT_VERSION } fake_xrt_t;

static struct {
    fake_node_t node[4];
    fake_xrt_t  xrt;
    unsigned    xrt_version[3];
    rlim_t      memlock; /* RLIM_INFINITY: unlimited */
    int         opened;  /* open fds not closed */
} F;

#define FAKE_FD 100

static int fake_open(const char *path, int flags) {
    (void)flags;
    const char *n = strrchr(path, 'l'); /* ".../accelN" */
    int         idx = n ? (int)strtol(n + 1, NULL, 10) : -1;
    cr_assert(idx >= 0 && idx < 4, "open of %s", path);
    if (F.node[idx].open_errno) {
        errno = F.node[idx].open_errno;
        return -1;
    }
    F.opened++;
    return FAKE_FD + idx;
}

static int fake_close(int fd) {
    cr_assert(fd >= FAKE_FD && fd < FAKE_FD + 4);
    F.opened--;
    return 0;
}

static int answer_info(const fake_node_t *fn, struct amdxdna_drm_get_info *gi) {
    void *buf = (void *)(uintptr_t)gi->buffer;
    if (gi->param == DRM_AMDXDNA_QUERY_AIE_VERSION && fn->info) {
        cr_assert_geq(gi->buffer_size, sizeof(struct amdxdna_drm_query_aie_version));
        *(struct amdxdna_drm_query_aie_version *)buf = (struct amdxdna_drm_query_aie_version){2, 0};
        return 0;
    }
    if (gi->param == DRM_AMDXDNA_QUERY_AIE_METADATA && fn->info) {
        cr_assert_geq(gi->buffer_size, sizeof(struct amdxdna_drm_query_aie_metadata));
        struct amdxdna_drm_query_aie_metadata *md = buf;
        md->cols = 8;
        md->rows = 6;
        return 0;
    }
    if (gi->param == DRM_AMDXDNA_QUERY_FIRMWARE_VERSION && fn->fw_ioctl) {
        cr_assert_geq(gi->buffer_size, sizeof(struct amdxdna_drm_query_firmware_version));
        *(struct amdxdna_drm_query_firmware_version *)buf =
            (struct amdxdna_drm_query_firmware_version){fn->fw[0], fn->fw[1], fn->fw[2], fn->fw[3]};
        return 0;
    }
    errno = EINVAL;
    return -1;
}

static int fake_ioctl(int fd, unsigned long request, void *arg) {
    cr_assert(fd >= FAKE_FD && fd < FAKE_FD + 4, "ioctl on fd %d", fd);
    const fake_node_t *fn = &F.node[fd - FAKE_FD];
    if (request == DRM_IOCTL_VERSION && fn->driver) {
        struct drm_version *v = arg;
        size_t              len = strlen(fn->driver);
        memcpy(v->name, fn->driver, len < v->name_len ? len : v->name_len);
        v->name_len = len; /* as drm_copy_field: the whole length */
        v->version_major = 0;
        v->version_minor = 1;
        v->version_patchlevel = 0;
        return 0;
    }
    if (request == DRM_IOCTL_AMDXDNA_GET_INFO && fn->driver &&
        strncmp(fn->driver, "amdxdna", 7) == 0)
        return answer_info(fn, arg);
    errno = ENOTTY;
    return -1;
}

static int fake_getrlimit(int resource, struct rlimit *rl) {
    cr_assert_eq(resource, RLIMIT_MEMLOCK);
    rl->rlim_cur = rl->rlim_max = F.memlock;
    return 0;
}

static unsigned xrt_major(void) {
    return F.xrt_version[0];
}
static unsigned xrt_minor(void) {
    return F.xrt_version[1];
}
static unsigned xrt_patch(void) {
    return F.xrt_version[2];
}

static int xrt_handle;

static void *fake_dlopen(const char *file, int mode) {
    (void)mode;
    cr_assert(strstr(file, "libxrt_coreutil"), "dlopen of %s", file);
    return F.xrt == XRT_MISSING ? NULL : &xrt_handle;
}

static void *fake_dlsym(void *h, const char *name) {
    cr_assert_eq(h, &xrt_handle);
    union {
        unsigned (*f)(void);
        void *p;
    } u = {.f = NULL};
    if (F.xrt == XRT_VERSION)
        u.f = !strcmp(name, "xrtVersionMajor")   ? xrt_major
              : !strcmp(name, "xrtVersionMinor") ? xrt_minor
              : !strcmp(name, "xrtVersionPatch") ? xrt_patch
                                                 : NULL;
    return u.p;
}

static int fake_dlclose(void *h) {
    cr_assert_eq(h, &xrt_handle);
    return 0;
}

static const char *fake_dlerror(void) {
    return "libxrt_coreutil.so.2: cannot open shared object file: No such file or directory";
}

static const npu_sys_t FAKE = {
    .open = fake_open,
    .ioctl = fake_ioctl,
    .close = fake_close,
    .getrlimit = fake_getrlimit,
    .dlopen = fake_dlopen,
    .dlsym = fake_dlsym,
    .dlclose = fake_dlclose,
    .dlerror = fake_dlerror,
};

/* ------------------------------------------------------------ the fake tree */

static char g_root[64];

static void put_file(const char *rel, const char *text) {
    char path[512], cmd[700];
    snprintf(path, sizeof path, "%s%s", g_root, rel);
    snprintf(cmd, sizeof cmd, "mkdir -p \"$(dirname '%s')\"", path);
    cr_assert_eq(system(cmd), 0);
    FILE *f = fopen(path, "w");
    cr_assert(f, "%s", path);
    cr_assert(fputs(text, f) >= 0);
    cr_assert_eq(fclose(f), 0);
}

/* accelN's node and its sysfs device: PCI vendor:device rev, the driver
 * link's target (NULL: none) and the driver's vbnv and fw_version
 * attributes (NULL: none). */
static void put_node(int n, unsigned vendor, unsigned device, unsigned rev, const char *driver,
                     const char *fw_version) {
    char rel[128], text[32], path[512], target[256];
    snprintf(rel, sizeof rel, "/dev/accel/accel%d", n);
    put_file(rel, "");
    snprintf(rel, sizeof rel, "/sys/class/accel/accel%d/device/", n);
    char at[192];
    snprintf(at, sizeof at, "%svendor", rel);
    snprintf(text, sizeof text, "0x%04x\n", vendor);
    put_file(at, text);
    snprintf(at, sizeof at, "%sdevice", rel);
    snprintf(text, sizeof text, "0x%04x\n", device);
    put_file(at, text);
    snprintf(at, sizeof at, "%srevision", rel);
    snprintf(text, sizeof text, "0x%02x\n", rev);
    put_file(at, text);
    if (fw_version) {
        snprintf(at, sizeof at, "%sfw_version", rel);
        put_file(at, fw_version);
    }
    if (driver) {
        snprintf(path, sizeof path, "%s%sdriver", g_root, rel);
        snprintf(target, sizeof target, "../../../../bus/pci/drivers/%s", driver);
        cr_assert_eq(symlink(target, path), 0, "%s", path);
    }
}

/* A ready XDNA2 machine: Strix (1022:17f0 rev 0x10), amdxdna answering
 * everything, firmware 1.1.2.65, XRT 2.20.1, memlock unlimited; each test
 * changes what it is about. */
static void setup(void) {
    snprintf(g_root, sizeof g_root, "/tmp/d3devs-XXXXXX");
    cr_assert(mkdtemp(g_root));
    cr_assert_eq(setenv("D3_TEST_DEVROOT", g_root, 1), 0);
    memset(&F, 0, sizeof F);
    F.node[0] = (fake_node_t){"amdxdna_accel_driver", 0, true, true, {1, 1, 2, 65}};
    F.xrt = XRT_VERSION;
    F.xrt_version[0] = 2;
    F.xrt_version[1] = 20;
    F.xrt_version[2] = 1;
    F.memlock = RLIM_INFINITY;
    npu_devices_test_sys(&FAKE);
}

static void teardown(void) {
    npu_devices_test_sys(NULL);
    unsetenv("D3_TEST_DEVROOT");
    rm_tree(g_root);
}

TestSuite(npu_devices, .init = setup, .fini = teardown);

static npu_devices_t *scan(void) {
    static npu_devices_t d;
    npu_devices_scan(&d);
    cr_assert_eq(F.opened, 0, "every node opened was closed");
    return &d;
}

#define has(s, sub) cr_assert(strstr((s), (sub)), "\"%s\" lacks \"%s\"", (s), (sub))

/* ------------------------------------------------------------ the cases */

Test(npu_devices, no_node) {
    npu_devices_t *d = scan();
    cr_assert_eq(d->n_accel_all, 0);
    cr_assert(!d->present && !d->ready);
    has(d->reason, "no XDNA NPU: /dev/accel does not exist");
    char why[2048];
    cr_assert_eq(npu_device_select(d, NPU_DEVICE_NPU, why, sizeof why), SVC_ERR_UNSUPPORTED);
    has(why, "/dev/accel does not exist");
    has(why, "no XDNA backend in this build");
    cr_assert_eq(npu_device_select(d, NPU_DEVICE_AUTO, why, sizeof why), SVC_OK);
    has(why, "the CPU; not the NPU: no XDNA NPU");
    /* the directory without a node */
    put_file("/dev/accel/README", "");
    d = scan();
    has(d->reason, "/dev/accel has no accel* node");
}

Test(npu_devices, another_vendors_accelerator) {
    put_node(0, 0x8086, 0x7d1d, 0, "intel_vpu", NULL);
    F.node[0] = (fake_node_t){.driver = "intel_vpu"};
    npu_devices_t *d = scan();
    cr_assert_eq(d->n_accel, 1);
    const npu_accel_t *a = &d->accel[0];
    cr_assert_str_eq(a->path, "/dev/accel/accel0");
    cr_assert_str_eq(a->driver, "intel_vpu");
    cr_assert(!a->amdxdna && a->can_open && !a->ready);
    cr_assert_eq(a->gen, NPU_XDNA_NONE);
    has(a->reason, "driver \"intel_vpu\": not an AMD XDNA NPU");
    cr_assert(!d->present);
    has(d->reason, "no XDNA NPU: /dev/accel/accel0: driver \"intel_vpu\"");
}

Test(npu_devices, xdna1_is_not_what_the_package_runs_on) {
    put_node(0, 0x1022, 0x1502, 0, "amdxdna", NULL);
    npu_devices_t     *d = scan();
    const npu_accel_t *a = &d->accel[0];
    cr_assert(a->amdxdna && a->can_open);
    cr_assert_eq(a->gen, NPU_XDNA1);
    cr_assert_str_eq(a->chip, "Phoenix/Hawk Point (npu1)");
    cr_assert(a->firmware.known && a->aie.known && a->cols == 8);
    cr_assert(!a->ready);
    has(a->reason, "XDNA1, Phoenix/Hawk Point (npu1): D3-Nano-NPU2's NPU kernels are XDNA2's");
    cr_assert(d->present && !d->ready);
    has(d->reason, "XDNA NPU /dev/accel/accel0 not usable: XDNA1");
}

Test(npu_devices, xdna2_ready_but_no_backend) {
    put_node(0, 0x1022, 0x17f0, 0x10, "amdxdna", NULL);
    put_file("/sys/class/accel/accel0/device/vbnv", "NPU Strix\n");
    npu_devices_t     *d = scan();
    const npu_accel_t *a = &d->accel[0];
    cr_assert_str_eq(a->driver, "amdxdna_accel_driver", "the DRM name wins over sysfs");
    cr_assert(a->driver_version.known && a->driver_version.minor == 1);
    cr_assert(a->pci_known && a->vendor == 0x1022 && a->device == 0x17f0 && a->revision == 0x10);
    cr_assert_eq(a->gen, NPU_XDNA2);
    cr_assert_str_eq(a->chip, "Strix (npu4)");
    cr_assert_str_eq(a->vbnv, "NPU Strix");
    cr_assert(a->aie.known && a->aie.major == 2 && a->cols == 8 && a->rows == 6);
    cr_assert(a->firmware.known && a->firmware.major == 1 && a->firmware.build == 65);
    cr_assert_str_eq(a->firmware_from, "ioctl");
    cr_assert(a->ready, "%s", a->reason);
    has(a->reason, "XDNA2, Strix (npu4), 8 columns, firmware 1.1.2.65");
    cr_assert(d->xrt.found && d->xrt.new_enough);
    cr_assert_str_eq(d->xrt.library, "libxrt_coreutil.so.2");
    has(d->xrt.reason, "XRT 2.20.1 (libxrt_coreutil.so.2): new enough");
    cr_assert(d->memlock.ok && d->memlock.unlimited);
    cr_assert(d->present && d->ready, "%s", d->reason);
    has(d->reason, "XDNA NPU /dev/accel/accel0 ready (Strix (npu4)), XRT 2.20.1");
    /* ready, and still never chosen: this build has no XDNA backend */
    char why[2048];
    cr_assert_eq(npu_device_select(d, NPU_DEVICE_NPU, why, sizeof why), SVC_ERR_UNSUPPORTED);
    has(why, "no XDNA backend in this build");
    cr_assert_eq(npu_device_select(d, NPU_DEVICE_AUTO, why, sizeof why), SVC_OK);
    has(why, "the CPU");
    cr_assert_eq(npu_device_select(d, NPU_DEVICE_CPU, why, sizeof why), SVC_OK);
}

Test(npu_devices, xdna2_chips_by_revision) {
    static const struct {
        unsigned    rev;
        const char *chip;
    } R[] = {{0x11, "Strix Halo (npu5)"}, {0x20, "Krackan (npu6)"}, {0x00, "npu2"}, {0x42, NULL}};
    for (size_t i = 0; i < sizeof R / sizeof R[0]; i++) {
        rm_tree(g_root);
        cr_assert_eq(mkdir(g_root, 0700), 0);
        put_node(0, 0x1022, 0x17f0, R[i].rev, "amdxdna", NULL);
        npu_devices_t *d = scan();
        cr_assert_eq(d->accel[0].gen, NPU_XDNA2);
        if (R[i].chip)
            cr_assert_str_eq(d->accel[0].chip, R[i].chip);
        else
            cr_assert_null(d->accel[0].chip);
        cr_assert(d->accel[0].ready, "rev 0x%02x: %s", R[i].rev, d->accel[0].reason);
    }
}

Test(npu_devices, permission_denied) {
    put_node(0, 0x1022, 0x17f0, 0x11, "amdxdna", NULL);
    char node[128];
    snprintf(node, sizeof node, "%s/dev/accel/accel0", g_root);
    cr_assert_eq(chmod(node, 0660), 0);
    /* a group this process is not in (as root: chown works; else the
     * file's own group, which the test user is in) */
    bool chowned = chown(node, 0, 4242) == 0;
    F.node[0].open_errno = EACCES;
    npu_devices_t     *d = scan();
    const npu_accel_t *a = &d->accel[0];
    cr_assert(!a->can_open && a->open_errno == EACCES);
    cr_assert(a->amdxdna, "the sysfs driver link says amdxdna");
    cr_assert_str_eq(a->driver, "amdxdna");
    cr_assert_eq(a->mode & 0777u, 0660u);
    cr_assert(!a->firmware.known && !a->ready);
    has(a->reason, "cannot open /dev/accel/accel0: Permission denied (mode 660");
    if (chowned) {
        cr_assert(!a->in_group);
        cr_assert_str_eq(a->group, "4242", "no such group: its number");
        has(a->reason, "this process is not in group 4242: add its user to it");
    }
    cr_assert(d->present && !d->ready);
    has(d->reason, "XDNA NPU /dev/accel/accel0 not usable: cannot open");
}

Test(npu_devices, old_firmware) {
    put_node(0, 0x1022, 0x17f0, 0x10, "amdxdna", NULL);
    F.node[0].fw[1] = 0; /* 1.0.2.65 */
    npu_devices_t     *d = scan();
    const npu_accel_t *a = &d->accel[0];
    cr_assert(!a->ready);
    has(a->reason, "firmware 1.0.2.65 is older than 1.1");
    cr_assert(d->present && !d->ready);
    has(d->reason, "not usable: XDNA2, Strix (npu4): firmware 1.0.2.65 is older");
}

/* A kernel without QUERY_FIRMWARE_VERSION: the driver's sysfs attribute. */
Test(npu_devices, firmware_from_sysfs) {
    put_node(0, 0x1022, 0x17f0, 0x10, "amdxdna", "1.1.2.64\n");
    F.node[0].fw_ioctl = false;
    npu_devices_t     *d = scan();
    const npu_accel_t *a = &d->accel[0];
    cr_assert(a->firmware.known && a->firmware.build == 64);
    cr_assert_str_eq(a->firmware_from, "sysfs");
    cr_assert(a->ready, "%s", a->reason);
    /* neither: unknown, not ready */
    rm_tree(g_root);
    cr_assert_eq(mkdir(g_root, 0700), 0);
    put_node(0, 0x1022, 0x17f0, 0x10, "amdxdna", NULL);
    d = scan();
    cr_assert(!d->accel[0].firmware.known && !d->accel[0].ready);
    has(d->accel[0].reason, "firmware version unknown");
}

Test(npu_devices, xrt_missing) {
    put_node(0, 0x1022, 0x17f0, 0x10, "amdxdna", NULL);
    F.xrt = XRT_MISSING;
    npu_devices_t *d = scan();
    cr_assert(d->accel[0].ready && !d->xrt.found && !d->xrt.new_enough);
    cr_assert_str_eq(d->xrt.library, "");
    has(d->xrt.reason, "no XRT: libxrt_coreutil.so.2 not found (dlopen: libxrt_coreutil.so.2: "
                       "cannot open shared object file");
    has(d->xrt.reason, "XDNA needs XRT 2.17 or later");
    cr_assert(d->present && !d->ready);
    has(d->reason, "XDNA NPU /dev/accel/accel0 ready, but no XRT");
}

Test(npu_devices, xrt_too_old) {
    put_node(0, 0x1022, 0x17f0, 0x10, "amdxdna", NULL);
    F.xrt_version[1] = 16;
    F.xrt_version[2] = 0;
    npu_devices_t *d = scan();
    cr_assert(d->xrt.found && d->xrt.version.known && !d->xrt.new_enough);
    has(d->xrt.reason, "XRT 2.16.0 (libxrt_coreutil.so.2) is older than 2.17");
    cr_assert(!d->ready);
    has(d->reason, "ready, but XRT 2.16.0");
    /* one without the version functions (Debian 12's 2.13 era) */
    F.xrt = XRT_NO_VERSION;
    d = scan();
    cr_assert(d->xrt.found && !d->xrt.version.known && !d->xrt.new_enough);
    has(d->xrt.reason, "exports no version");
    /* 3.0 is newer */
    F.xrt = XRT_VERSION;
    F.xrt_version[0] = 3;
    F.xrt_version[1] = 0;
    cr_assert(scan()->xrt.new_enough);
}

Test(npu_devices, memlock_limited) {
    put_node(0, 0x1022, 0x17f0, 0x10, "amdxdna", NULL);
    F.memlock = 8u << 20;
    npu_devices_t *d = scan();
    cr_assert(d->memlock.known && !d->memlock.ok && !d->memlock.unlimited);
    cr_assert_eq(d->memlock.soft, 8u << 20);
    has(d->memlock.reason, "RLIMIT_MEMLOCK 8 MiB (hard 8 MiB)");
    has(d->memlock.reason, "LimitMEMLOCK=infinity");
    cr_assert(!d->ready);
    has(d->reason, "ready, but RLIMIT_MEMLOCK 8 MiB");
}

/* Nodes in number order; the XDNA one is chosen over another vendor's. */
Test(npu_devices, nodes_in_order_and_the_xdna_one_chosen) {
    put_node(2, 0x1022, 0x17f0, 0x10, "amdxdna", NULL);
    put_node(0, 0x8086, 0x7d1d, 0, "intel_vpu", NULL);
    F.node[0] = (fake_node_t){.driver = "intel_vpu"};
    F.node[2] = (fake_node_t){"amdxdna_accel_driver", 0, true, true, {1, 1, 2, 65}};
    npu_devices_t *d = scan();
    cr_assert_eq(d->n_accel, 2);
    cr_assert_str_eq(d->accel[0].path, "/dev/accel/accel0");
    cr_assert_str_eq(d->accel[1].path, "/dev/accel/accel2");
    cr_assert(d->present && d->ready, "%s", d->reason);
    has(d->reason, "/dev/accel/accel2 ready");
}

/* npu_devices() is the same scan, once. */
Test(npu_devices, once_per_process) {
    put_node(0, 0x1022, 0x1502, 0, "amdxdna", NULL);
    const npu_devices_t *d = npu_devices();
    cr_assert_eq(d, npu_devices());
    cr_assert(d->present);
    cr_assert_eq(d->accel[0].gen, NPU_XDNA1);
}
