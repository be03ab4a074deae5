/*
 * npu_devices.c -- the AMD XDNA NPU, found (npu.h, npu_devices_t): each
 * /dev/accel/accel* node asked what it is, RLIMIT_MEMLOCK, XRT
 * (npu_xrt.c), and a verdict with its reason for each and for the whole.
 *
 * Only what a read-only look can tell: a node is opened, asked
 * DRM_IOCTL_VERSION and the amdxdna GET_INFO queries, and closed; no
 * hardware context is made. D3_TEST_DEVROOT (tests only) stands for / when
 * /dev and /sys are read, and npu_devices_test_sys replaces the calls, so
 * that every case can be tested on machines without an NPU.
 */
#include "npu_devices_int.h"

#include <dirent.h>
#include <dlfcn.h>
#include <errno.h>
#include <fcntl.h>
#include <grp.h>
#include <limits.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

/* ------------------------------------------------------------ the calls */

static int sys_open(const char *path, int flags) {
    return open(path, flags);
}

static int sys_ioctl(int fd, unsigned long request, void *arg) {
    return ioctl(fd, request, arg);
}

static int sys_getrlimit(int resource, struct rlimit *rl) {
    return getrlimit((__rlimit_resource_t)resource, rl);
}

static const char *sys_dlerror(void) {
    return dlerror();
}

static const npu_sys_t SYSTEM = {
    .open = sys_open,
    .ioctl = sys_ioctl,
    .close = close,
    .getrlimit = sys_getrlimit,
    .dlopen = dlopen,
    .dlsym = dlsym,
    .dlclose = dlclose,
    .dlerror = sys_dlerror,
};

static const npu_sys_t *g_sys = &SYSTEM;

const npu_sys_t *npu_sys(void) {
    return g_sys;
}

void npu_devices_test_sys(const npu_sys_t *sys) {
    g_sys = sys ? sys : &SYSTEM;
}

/* ------------------------------------------------------------ files */

/* root + path into out; false when it does not fit. */
static bool at_root(char *out, size_t n, const char *fmt, ...) SVC_FMT(3, 4);
static bool at_root(char *out, size_t n, const char *fmt, ...) {
    const char *root = getenv("D3_TEST_DEVROOT");
    int         k = snprintf(out, n, "%s", root ? root : "");
    if (k < 0 || (size_t)k >= n)
        return false;
    va_list ap;
    va_start(ap, fmt);
    int m = vsnprintf(out + k, n - (size_t)k, fmt, ap);
    va_end(ap);
    return m >= 0 && (size_t)m < n - (size_t)k;
}

/* src into dst, cut to what fits (names from sysfs and the driver). */
static void set_str(char *dst, size_t n, const char *src) {
    size_t len = strnlen(src, n - 1);
    memcpy(dst, src, len);
    dst[len] = '\0';
}

/* The first line of a small file (sysfs), without its newline. */
static bool read_line(const char *path, char *out, size_t n) {
    FILE *f = fopen(path, "r");
    bool  ok = f && fgets(out, (int)n, f);
    if (f)
        fclose(f);
    if (ok)
        out[strcspn(out, "\n")] = '\0';
    return ok;
}

/* A sysfs attribute of accelN's device as a number ("0x17f0"). */
static bool sysfs_num(unsigned idx, const char *attr, unsigned *out) {
    char path[PATH_MAX], line[64];
    if (!at_root(path, sizeof path, "/sys/class/accel/accel%u/device/%s", idx, attr) ||
        !read_line(path, line, sizeof line))
        return false;
    char         *end;
    unsigned long v = strtoul(line, &end, 0);
    if (end == line || v > UINT32_MAX)
        return false;
    *out = (unsigned)v;
    return true;
}

/* ------------------------------------------------------------ one node */

/* The sysfs side: PCI id, generation, the driver's names for it. */
static void node_sysfs(unsigned idx, npu_accel_t *a) {
    char path[PATH_MAX], link[PATH_MAX];
    a->pci_known = sysfs_num(idx, "vendor", &a->vendor) && sysfs_num(idx, "device", &a->device);
    if (a->pci_known && !sysfs_num(idx, "revision", &a->revision))
        a->revision = 0;
    if (a->pci_known && a->vendor == 0x1022 && a->device == 0x1502) {
        a->gen = NPU_XDNA1;
        a->chip = "Phoenix/Hawk Point (npu1)";
    } else if (a->pci_known && a->vendor == 0x1022 && a->device == 0x17f0) {
        /* amdxdna's table (amdxdna_pci_drv.c): the revision picks the chip */
        a->gen = NPU_XDNA2;
        a->chip = a->revision == 0x10   ? "Strix (npu4)"
                  : a->revision == 0x11 ? "Strix Halo (npu5)"
                  : a->revision == 0x20 ? "Krackan (npu6)"
                  : a->revision == 0x00 ? "npu2"
                                        : NULL;
    }
    if (at_root(path, sizeof path, "/sys/class/accel/accel%u/device/vbnv", idx))
        (void)read_line(path, a->vbnv, sizeof a->vbnv);
    ssize_t n = -1;
    if (at_root(path, sizeof path, "/sys/class/accel/accel%u/device/driver", idx))
        n = readlink(path, link, sizeof link - 1);
    if (n > 0) {
        link[n] = '\0';
        const char *base = strrchr(link, '/');
        set_str(a->driver, sizeof a->driver, base ? base + 1 : link);
    }
}

/* The node's owner, group and mode, and whether this process is in the
 * group (the render group, on every distribution that ships amdxdna). */
static void node_perms(const char *real, npu_accel_t *a) {
    struct stat sb;
    if (stat(real, &sb) != 0)
        return;
    a->mode = (unsigned)sb.st_mode;
    a->uid = (unsigned)sb.st_uid;
    a->gid = (unsigned)sb.st_gid;
    struct group gr, *res = NULL;
    char         buf[4096];
    gid_t        groups[256];
    int          n = getgroups(256, groups);
    if (getgrgid_r(sb.st_gid, &gr, buf, sizeof buf, &res) == 0 && res)
        svc_errf(a->group, sizeof a->group, "%s", gr.gr_name);
    else
        svc_errf(a->group, sizeof a->group, "%u", a->gid);
    a->in_group = getegid() == sb.st_gid;
    for (int i = 0; i < n && !a->in_group; i++)
        a->in_group = groups[i] == sb.st_gid;
}

/* GET_INFO of one parameter into buf; 0 or the errno. */
static int get_info(int fd, uint32_t param, void *buf, size_t size) {
    struct amdxdna_drm_get_info gi = {
        .param = param, .buffer_size = (uint32_t)size, .buffer = (uint64_t)(uintptr_t)buf};
    return npu_sys()->ioctl(fd, DRM_IOCTL_AMDXDNA_GET_INFO, &gi) == 0 ? 0 : (errno ? errno : EIO);
}

/* The driver's name and version (any DRM node answers it). */
static void ask_version(int fd, npu_accel_t *a) {
    char               name[64] = "";
    struct drm_version v = {.name = name, .name_len = sizeof name - 1};
    if (npu_sys()->ioctl(fd, DRM_IOCTL_VERSION, &v) != 0)
        return;
    name[v.name_len < sizeof name ? v.name_len : sizeof name - 1] = '\0';
    set_str(a->driver, sizeof a->driver, name);
    a->driver_version = (npu_version_t){true, (unsigned)v.version_major, (unsigned)v.version_minor,
                                        (unsigned)v.version_patchlevel, 0};
}

/* amdxdna's own answers: AIE version and array, firmware. */
static void ask_amdxdna(int fd, unsigned idx, npu_accel_t *a) {
    struct amdxdna_drm_query_aie_version      av = {0};
    struct amdxdna_drm_query_aie_metadata     md = {0};
    struct amdxdna_drm_query_firmware_version fw = {0};
    if (get_info(fd, DRM_AMDXDNA_QUERY_AIE_VERSION, &av, sizeof av) == 0)
        a->aie = (npu_version_t){true, av.major, av.minor, 0, 0};
    if (get_info(fd, DRM_AMDXDNA_QUERY_AIE_METADATA, &md, sizeof md) == 0) {
        a->cols = md.cols;
        a->rows = md.rows;
    }
    if (get_info(fd, DRM_AMDXDNA_QUERY_FIRMWARE_VERSION, &fw, sizeof fw) == 0) {
        a->firmware = (npu_version_t){true, fw.major, fw.minor, fw.patch, fw.build};
        a->firmware_from = "ioctl";
        return;
    }
    /* kernels without the query: the driver's sysfs attribute */
    char path[PATH_MAX], line[64];
    if (at_root(path, sizeof path, "/sys/class/accel/accel%u/device/fw_version", idx) &&
        read_line(path, line, sizeof line) &&
        sscanf(line, "%u.%u.%u.%u", &a->firmware.major, &a->firmware.minor, &a->firmware.patch,
               &a->firmware.build) == 4) {
        a->firmware.known = true;
        a->firmware_from = "sysfs";
    }
}

static bool is_amdxdna(const npu_accel_t *a) {
    if (a->driver[0])
        return strncmp(a->driver, "amdxdna", 7) == 0;
    /* no driver name: only amdxdna binds these PCI ids */
    return a->gen != NPU_XDNA_NONE;
}

static bool firmware_old(const npu_version_t *v) {
    return v->major < NPU_XDNA_FW_MIN_MAJOR ||
           (v->major == NPU_XDNA_FW_MIN_MAJOR && v->minor < NPU_XDNA_FW_MIN_MINOR);
}

/* Why this process cannot open the node, with the fix. */
static void reason_open(npu_accel_t *a) {
    char who[160] = "";
    if (a->open_errno == EACCES || a->open_errno == EPERM)
        snprintf(who, sizeof who,
                 a->in_group ? "; this process is in group %s, and still may not open it"
                             : "; this process is not in group %s: add its user to it "
                               "(usermod -aG %s USER, then log in again) or give its unit "
                               "SupplementaryGroups=%s",
                 a->group, a->group, a->group);
    svc_errf(a->reason, sizeof a->reason, "cannot open %s: %s (mode %03o, owner %u, group %s%s)",
             a->path, strerror(a->open_errno), a->mode & 0777u, a->uid, a->group, who);
}

/* The node's verdict: the first thing that stops an XDNA backend, in the
 * order an operator can act on (what the device is, then access, then
 * firmware). */
static void node_verdict(npu_accel_t *a) {
    const npu_version_t *fw = &a->firmware;
    if (!a->amdxdna) {
        if (a->driver[0])
            svc_errf(a->reason, sizeof a->reason, "driver \"%s\": not an AMD XDNA NPU (amdxdna)",
                     a->driver);
        else
            svc_errf(a->reason, sizeof a->reason,
                     "driver unknown (not opened: %s; no sysfs driver link) and no XDNA PCI id",
                     a->can_open ? "it answered no DRM_IOCTL_VERSION" : strerror(a->open_errno));
    } else if (a->gen == NPU_XDNA1)
        svc_errf(a->reason, sizeof a->reason,
                 "XDNA1, %s: D3-Nano-NPU2's NPU kernels are XDNA2's (its seed runtime, "
                 "FastFlowLM, runs on XDNA2 only: Strix, Strix Halo, Krackan)",
                 a->chip);
    else if (a->gen == NPU_XDNA_NONE)
        svc_errf(a->reason, sizeof a->reason,
                 a->pci_known ? "amdxdna, but PCI id %04x:%04x is neither XDNA1 (1022:1502) nor "
                                "XDNA2 (1022:17f0)"
                              : "amdxdna, but no PCI id in sysfs (%04x:%04x)",
                 a->vendor, a->device);
    else if (!a->can_open)
        reason_open(a);
    else if (!fw->known)
        svc_errf(a->reason, sizeof a->reason,
                 "XDNA2, %s: firmware version unknown (GET_INFO QUERY_FIRMWARE_VERSION refused "
                 "and no sysfs fw_version)",
                 a->chip ? a->chip : "unknown revision");
    else if (firmware_old(fw))
        svc_errf(a->reason, sizeof a->reason,
                 "XDNA2, %s: firmware %u.%u.%u.%u is older than %d.%d (the firmware line the "
                 "XDNA stack's Linux set-up installs; a FastFlowLM baseline runs 1.1.2.65): "
                 "update linux-firmware's amdnpu/ files with a matching amdxdna driver",
                 a->chip ? a->chip : "unknown revision", fw->major, fw->minor, fw->patch, fw->build,
                 NPU_XDNA_FW_MIN_MAJOR, NPU_XDNA_FW_MIN_MINOR);
    else {
        a->ready = true;
        svc_errf(a->reason, sizeof a->reason,
                 "XDNA2, %s, %u columns, firmware %u.%u.%u.%u: what an XDNA backend needs of "
                 "the device",
                 a->chip ? a->chip : "unknown revision", a->cols, fw->major, fw->minor, fw->patch,
                 fw->build);
    }
}

static void node_scan(unsigned idx, npu_accel_t *a) {
    char real[PATH_MAX];
    memset(a, 0, sizeof *a);
    snprintf(a->path, sizeof a->path, "/dev/accel/accel%u", idx);
    node_sysfs(idx, a);
    if (at_root(real, sizeof real, "%s", a->path)) {
        node_perms(real, a);
        errno = 0;
        int fd = npu_sys()->open(real, O_RDWR | O_CLOEXEC);
        a->can_open = fd >= 0;
        a->open_errno = fd >= 0 ? 0 : (errno ? errno : EIO);
        if (fd >= 0) {
            ask_version(fd, a);
            if (is_amdxdna(a))
                ask_amdxdna(fd, idx, a);
            npu_sys()->close(fd);
        }
    }
    a->amdxdna = is_amdxdna(a);
    node_verdict(a);
}

/* ------------------------------------------------------------ the machine */

static int cmp_unsigned(const void *x, const void *y) {
    unsigned a = *(const unsigned *)x, b = *(const unsigned *)y;
    return a < b ? -1 : a > b;
}

/* The accel node numbers in /dev/accel, in order; *n_all counts them all.
 * false when the directory does not exist. */
static bool list_nodes(unsigned *idx, size_t max, size_t *n, size_t *n_all) {
    char dir[PATH_MAX];
    *n = *n_all = 0;
    DIR *d = at_root(dir, sizeof dir, "/dev/accel") ? opendir(dir) : NULL;
    if (!d)
        return false;
    struct dirent *de;
    while ((de = readdir(d))) {
        char         *end;
        unsigned long v;
        if (strncmp(de->d_name, "accel", 5) != 0 || !de->d_name[5])
            continue;
        v = strtoul(de->d_name + 5, &end, 10);
        if (*end || v > 4096)
            continue;
        if (*n < max)
            idx[(*n)++] = (unsigned)v;
        (*n_all)++;
    }
    closedir(d);
    qsort(idx, *n, sizeof *idx, cmp_unsigned);
    return true;
}

static void human_bytes(uint64_t v, char *out, size_t n) {
    if (v == UINT64_MAX)
        snprintf(out, n, "unlimited");
    else if (v >= (1u << 20) && v % (1u << 20) == 0)
        snprintf(out, n, "%llu MiB", (unsigned long long)(v >> 20));
    else if (v >= 1024 && v % 1024 == 0)
        snprintf(out, n, "%llu KiB", (unsigned long long)(v >> 10));
    else
        snprintf(out, n, "%llu bytes", (unsigned long long)v);
}

static void memlock_scan(npu_memlock_t *m) {
    struct rlimit rl;
    char          soft[32], hard[32];
    memset(m, 0, sizeof *m);
    errno = 0;
    if (npu_sys()->getrlimit(RLIMIT_MEMLOCK, &rl) != 0) {
        svc_errf(m->reason, sizeof m->reason, "getrlimit(RLIMIT_MEMLOCK) failed: %s",
                 strerror(errno ? errno : EIO));
        return;
    }
    m->known = true;
    m->soft = rl.rlim_cur == RLIM_INFINITY ? UINT64_MAX : (uint64_t)rl.rlim_cur;
    m->hard = rl.rlim_max == RLIM_INFINITY ? UINT64_MAX : (uint64_t)rl.rlim_max;
    m->unlimited = m->ok = rl.rlim_cur == RLIM_INFINITY;
    human_bytes(m->soft, soft, sizeof soft);
    human_bytes(m->hard, hard, sizeof hard);
    if (m->ok)
        svc_errf(m->reason, sizeof m->reason, "RLIMIT_MEMLOCK unlimited");
    else
        svc_errf(m->reason, sizeof m->reason,
                 "RLIMIT_MEMLOCK %s (hard %s): XRT pins the buffers it shares with the NPU, and "
                 "the XDNA stack's set-up asks for unlimited (memlock unlimited in "
                 "/etc/security/limits.conf, or LimitMEMLOCK=infinity in the unit)",
                 soft, hard);
}

/* The first amdxdna node that is ready, else the first amdxdna node. */
static const npu_accel_t *best_node(const npu_devices_t *d) {
    const npu_accel_t *first = NULL;
    for (size_t i = 0; i < d->n_accel; i++) {
        if (!d->accel[i].amdxdna)
            continue;
        if (d->accel[i].ready)
            return &d->accel[i];
        if (!first)
            first = &d->accel[i];
    }
    return first;
}

static void summary(npu_devices_t *d, bool have_dir) {
    const npu_accel_t *a = best_node(d);
    d->present = a != NULL;
    d->ready = a && a->ready && d->xrt.new_enough && d->memlock.ok;
    if (d->n_accel_all == 0)
        svc_errf(d->reason, sizeof d->reason,
                 "no XDNA NPU: %s (no accelerator driver has bound a device, or a container "
                 "was not given it; amdxdna, in Linux 6.14 and later, binds Ryzen AI NPUs)",
                 have_dir ? "/dev/accel has no accel* node" : "/dev/accel does not exist");
    else if (!a)
        svc_errf(d->reason, sizeof d->reason, "no XDNA NPU: %s: %s", d->accel[0].path,
                 d->accel[0].reason);
    else if (!a->ready)
        svc_errf(d->reason, sizeof d->reason, "XDNA NPU %s not usable: %s", a->path, a->reason);
    else if (!d->xrt.new_enough)
        svc_errf(d->reason, sizeof d->reason, "XDNA NPU %s ready, but %s", a->path, d->xrt.reason);
    else if (!d->memlock.ok)
        svc_errf(d->reason, sizeof d->reason, "XDNA NPU %s ready, but %s", a->path,
                 d->memlock.reason);
    else
        svc_errf(d->reason, sizeof d->reason, "XDNA NPU %s ready (%s), %s", a->path,
                 a->chip ? a->chip : "XDNA2", d->xrt.reason);
}

void npu_devices_scan(npu_devices_t *d) {
    unsigned idx[NPU_ACCEL_MAX];
    memset(d, 0, sizeof *d);
    bool have_dir = list_nodes(idx, NPU_ACCEL_MAX, &d->n_accel, &d->n_accel_all);
    for (size_t i = 0; i < d->n_accel; i++)
        node_scan(idx[i], &d->accel[i]);
    memlock_scan(&d->memlock);
    npu_xrt_scan(&d->xrt);
    summary(d, have_dir);
}

static npu_devices_t  g_devices;
static pthread_once_t g_devices_once = PTHREAD_ONCE_INIT;

static void devices_once(void) {
    npu_devices_scan(&g_devices);
}

const npu_devices_t *npu_devices(void) {
    pthread_once(&g_devices_once, devices_once);
    return &g_devices;
}

/* ------------------------------------------------------------ the choice */

svc_err_t npu_device_select(const npu_devices_t *d, npu_device_req_t req, char *why,
                            size_t why_size) {
    switch (req) {
    case NPU_DEVICE_CPU:
        svc_errf(why, why_size, "the CPU, as asked");
        return SVC_OK;
    case NPU_DEVICE_AUTO:
        svc_errf(why, why_size, "the CPU; not the NPU: %s; and no XDNA backend in this build",
                 d->reason);
        return SVC_OK;
    case NPU_DEVICE_NPU:
    default:
        svc_errf(why, why_size, "%s; and no XDNA backend in this build", d->reason);
        return SVC_ERR_UNSUPPORTED;
    }
}
