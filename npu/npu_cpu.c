/*
 * npu_cpu.c -- CPU discovery (the NPU's is npu_devices.c).
 *
 * AMX needs two things: the cpuid bits, and the kernel's permission to use
 * the large tile state (arch_prctl ARCH_REQ_XCOMP_PERM, Linux >= 5.16).
 * Without the permission the first tile instruction kills the process, so
 * amx_usable is what kernels must check, not amx_int8.
 */
#include "npu.h"

#include <cpuid.h>
#include <limits.h>
#include <math.h>
#include <pthread.h>
#include <sched.h>
#include <stdio.h>
#include <string.h>
#include <sys/syscall.h>
#include <unistd.h>

#define ARCH_REQ_XCOMP_PERM 0x1023
#define XFEATURE_XTILEDATA  18

static npu_features_t g_features;
static pthread_once_t g_once = PTHREAD_ONCE_INIT;

static bool bit(unsigned reg, int n) {
    return (reg >> n) & 1u;
}

/* OS support for the AVX-512 state (XCR0 bits 1,2,5,6,7). */
static bool os_saves_zmm(void) {
    unsigned a, b, c, d;
    if (!__get_cpuid(1, &a, &b, &c, &d) || !bit(c, 27))
        return false;
    unsigned lo, hi;
    __asm__ volatile("xgetbv" : "=a"(lo), "=d"(hi) : "c"(0));
    return (lo & 0xe6u) == 0xe6u;
}

static void probe_cpuid(npu_features_t *f) {
    unsigned a, b, c, d;
    if (__get_cpuid(1, &a, &b, &c, &d))
        f->fma = bit(c, 12);
    if (!__get_cpuid_count(7, 0, &a, &b, &c, &d))
        return;
    bool zmm = os_saves_zmm();
    f->avx2 = bit(b, 5);
    f->avx512f = zmm && bit(b, 16);
    f->avx512bw = zmm && bit(b, 30);
    f->avx512dq = zmm && bit(b, 17);
    f->avx512vl = zmm && bit(b, 31);
    f->avx512_vnni = zmm && bit(c, 11);
    f->avx512_fp16 = zmm && bit(d, 23);
    f->amx_bf16 = bit(d, 22);
    f->amx_tile = bit(d, 24);
    f->amx_int8 = bit(d, 25);
    unsigned a1, b1, c1, d1;
    if (__get_cpuid_count(7, 1, &a1, &b1, &c1, &d1))
        f->avx512_bf16 = zmm && bit(a1, 5);
}

static bool request_amx(void) {
    return syscall(SYS_arch_prctl, ARCH_REQ_XCOMP_PERM, XFEATURE_XTILEDATA) == 0;
}

/* The CPU time a cgroup file pair allows, in CPUs (0: no limit). v2's
 * cpu.max is "QUOTA PERIOD" or "max PERIOD"; v1 has cfs_quota_us (-1: no
 * limit) and cfs_period_us. */
static double quota_at(const char *dir, bool v2) {
    char   path[PATH_MAX + 32], q[32] = "";
    double quota = 0, period = 0;
    snprintf(path, sizeof path, "%s/%s", dir, v2 ? "cpu.max" : "cpu.cfs_quota_us");
    FILE *f = fopen(path, "r");
    if (!f)
        return 0;
    bool ok = v2 ? fscanf(f, "%31s %lf", q, &period) == 2 : fscanf(f, "%lf", &quota) == 1;
    fclose(f);
    if (ok && v2)
        ok = strcmp(q, "max") != 0 && sscanf(q, "%lf", &quota) == 1;
    if (ok && !v2) {
        snprintf(path, sizeof path, "%s/cpu.cfs_period_us", dir);
        f = fopen(path, "r");
        ok = f && fscanf(f, "%lf", &period) == 1;
        if (f)
            fclose(f);
    }
    return ok && quota > 0 && period > 0 ? quota / period : 0;
}

/* The tightest quota on the cgroup at mount + rel and its ancestors up to
 * the mount (a container's root cgroup is its mount). */
static double quota_up(const char *mount, const char *rel, bool v2) {
    char   dir[PATH_MAX];
    double best = 0;
    int    n = snprintf(dir, sizeof dir, "%s%s", mount, strcmp(rel, "/") ? rel : "");
    if (n < 0 || (size_t)n >= sizeof dir)
        return 0;
    for (size_t root = strlen(mount);;) {
        double q = quota_at(dir, v2);
        if (q > 0 && (best == 0 || q < best))
            best = q;
        char *slash = strrchr(dir, '/');
        if (!slash || (size_t)(slash - dir) < root)
            return best;
        *slash = '\0';
    }
}

/* CPUs' worth of time the process's cgroup allows (docker --cpus,
 * Kubernetes limits.cpu, systemd CPUQuota=), 0 when none: a quota is not
 * in the affinity mask, and a pool of a 64-core host's threads under a
 * 2-CPU quota is throttled in every call, each waiting for its slowest
 * item. */
static double cgroup_cpu_quota(void) {
    FILE  *f = fopen("/proc/self/cgroup", "r");
    char   line[PATH_MAX + 64];
    double best = 0;
    while (f && fgets(line, sizeof line, f)) {
        line[strcspn(line, "\n")] = '\0';
        char *c1 = strchr(line, ':'), *c2 = c1 ? strchr(c1 + 1, ':') : NULL;
        if (!c2)
            continue;
        *c2 = '\0';
        const char *ctrls = c1 + 1, *rel = c2 + 1;
        double      q = 0;
        if (!*ctrls && strcmp(line, "0") == 0) /* v2: "0::/path" */
            q = quota_up("/sys/fs/cgroup", rel, true);
        else if (strcmp(ctrls, "cpu") == 0 || strcmp(ctrls, "cpu,cpuacct") == 0 ||
                 strcmp(ctrls, "cpuacct,cpu") == 0) {
            char mount[64];
            snprintf(mount, sizeof mount, "/sys/fs/cgroup/%s", ctrls);
            q = quota_up(mount, rel, false);
        }
        if (q > 0 && (best == 0 || q < best))
            best = q;
    }
    if (f)
        fclose(f);
    return best;
}

/* The affinity mask's CPUs into f->n_affinity, the cgroup quota into
 * f->cpu_quota, and the smaller (the quota rounded up) into f->n_cpus. */
static void count_cpus(npu_features_t *f) {
    cpu_set_t set;
    long      n = 0;
    if (sched_getaffinity(0, sizeof set, &set) == 0)
        n = CPU_COUNT(&set);
    else
        n = sysconf(_SC_NPROCESSORS_ONLN);
    f->n_affinity = n > 0 ? (int)n : 1;
    f->cpu_quota = cgroup_cpu_quota();
    if (f->cpu_quota > 0 && (double)n > ceil(f->cpu_quota))
        n = (long)ceil(f->cpu_quota);
    f->n_cpus = n > 0 ? (int)n : 1;
}

static void probe_once(void) {
    npu_features_t *f = &g_features;
    probe_cpuid(f);
    f->amx_usable = f->amx_tile && request_amx();
    count_cpus(f);
}

const npu_features_t *npu_probe(void) {
    pthread_once(&g_once, probe_once);
    return &g_features;
}

svc_err_t npu_features_describe_kind(const npu_features_t *f, npu_feature_kind_t kind,
                                     svc_buf_t *out) {
    static const struct {
        const char        *name;
        size_t             off;
        npu_feature_kind_t kind;
    } names[] = {
        {"avx2", offsetof(npu_features_t, avx2), NPU_FEATURES_VECTOR},
        {"fma", offsetof(npu_features_t, fma), NPU_FEATURES_VECTOR},
        {"avx512f", offsetof(npu_features_t, avx512f), NPU_FEATURES_VECTOR},
        {"avx512bw", offsetof(npu_features_t, avx512bw), NPU_FEATURES_VECTOR},
        {"avx512dq", offsetof(npu_features_t, avx512dq), NPU_FEATURES_VECTOR},
        {"avx512vl", offsetof(npu_features_t, avx512vl), NPU_FEATURES_VECTOR},
        {"avx512_vnni", offsetof(npu_features_t, avx512_vnni), NPU_FEATURES_VECTOR},
        {"avx512_bf16", offsetof(npu_features_t, avx512_bf16), NPU_FEATURES_VECTOR},
        {"avx512_fp16", offsetof(npu_features_t, avx512_fp16), NPU_FEATURES_VECTOR},
        {"amx_tile", offsetof(npu_features_t, amx_tile), NPU_FEATURES_MATRIX},
        {"amx_int8", offsetof(npu_features_t, amx_int8), NPU_FEATURES_MATRIX},
        {"amx_bf16", offsetof(npu_features_t, amx_bf16), NPU_FEATURES_MATRIX},
        {"amx_usable", offsetof(npu_features_t, amx_usable), NPU_FEATURES_MATRIX},
    };
    bool first = true;
    for (size_t i = 0; i < sizeof names / sizeof names[0]; i++) {
        const bool *on = (const bool *)((const char *)f + names[i].off);
        if (!*on || (kind != NPU_FEATURES_ALL && kind != names[i].kind))
            continue;
        svc_err_t err = svc_buf_addf(out, "%s%s", first ? "" : " ", names[i].name);
        if (err)
            return err;
        first = false;
    }
    return first ? svc_buf_adds(out, "none") : SVC_OK;
}

svc_err_t npu_features_describe(const npu_features_t *f, svc_buf_t *out) {
    return npu_features_describe_kind(f, NPU_FEATURES_ALL, out);
}
