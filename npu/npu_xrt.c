/*
 * npu_xrt.c -- XRT, found: its core library opened with dlopen, its version
 * read, and whether it is new enough for XDNA (npu.h, npu_xrt_t).
 *
 * Nothing of XRT is linked or included: the library is asked for the C
 * functions its xrt_version.h declares (xrtVersionMajor, xrtVersionMinor,
 * xrtVersionPatch; "C" linkage, exported by libxrt_coreutil since 2023),
 * then closed. An XRT that predates them (Debian 12's 2.13) predates XDNA
 * support too, and is reported so.
 */
#include "npu_devices_int.h"

#include <dlfcn.h>
#include <stdio.h>
#include <string.h>

/* Where XRT's core library may be: the loader's path first (a distribution
 * package, or LD_LIBRARY_PATH after XRT's setup.sh), then the prefix AMD's
 * own packages install to, which is not on the loader's path. */
static const char *const XRT_LIBS[] = {
    "libxrt_coreutil.so.2",
    "libxrt_coreutil.so",
    "/opt/xilinx/xrt/lib/libxrt_coreutil.so.2",
};
#define N_XRT_LIBS (sizeof XRT_LIBS / sizeof XRT_LIBS[0])

typedef unsigned (*xrt_version_fn)(void);

/* fn() of the library, or false when it does not export name. */
static bool version_part(void *h, const char *name, unsigned *out) {
    union {
        void          *p;
        xrt_version_fn f;
    } sym = {.p = npu_sys()->dlsym(h, name)};
    if (!sym.p)
        return false;
    *out = sym.f();
    return true;
}

static void read_version(void *h, npu_xrt_t *x) {
    npu_version_t *v = &x->version;
    v->known = version_part(h, "xrtVersionMajor", &v->major) &&
               version_part(h, "xrtVersionMinor", &v->minor);
    if (v->known && !version_part(h, "xrtVersionPatch", &v->patch))
        v->patch = 0;
    x->new_enough = v->known && (v->major > NPU_XRT_MIN_MAJOR ||
                                 (v->major == NPU_XRT_MIN_MAJOR && v->minor >= NPU_XRT_MIN_MINOR));
}

static void reason_of(npu_xrt_t *x, const char *tried_error) {
    const npu_version_t *v = &x->version;
    if (!x->found)
        svc_errf(x->reason, sizeof x->reason,
                 "no XRT: libxrt_coreutil.so.2 not found (dlopen: %s; also tried "
                 "libxrt_coreutil.so and /opt/xilinx/xrt/lib): XDNA needs XRT %d.%d or later "
                 "with its amdxdna plugin",
                 tried_error, NPU_XRT_MIN_MAJOR, NPU_XRT_MIN_MINOR);
    else if (!v->known)
        svc_errf(x->reason, sizeof x->reason,
                 "XRT %s exports no version (xrtVersionMajor/xrtVersionMinor, which XRT has had "
                 "since 2023): older than %d.%d, the first with XDNA support",
                 x->library, NPU_XRT_MIN_MAJOR, NPU_XRT_MIN_MINOR);
    else if (!x->new_enough)
        svc_errf(x->reason, sizeof x->reason,
                 "XRT %u.%u.%u (%s) is older than %d.%d, the first with XDNA support", v->major,
                 v->minor, v->patch, x->library, NPU_XRT_MIN_MAJOR, NPU_XRT_MIN_MINOR);
    else
        svc_errf(x->reason, sizeof x->reason, "XRT %u.%u.%u (%s): new enough for XDNA (%d.%d+)",
                 v->major, v->minor, v->patch, x->library, NPU_XRT_MIN_MAJOR, NPU_XRT_MIN_MINOR);
}

void npu_xrt_scan(npu_xrt_t *x) {
    const npu_sys_t *sys = npu_sys();
    char             first_error[200] = "";
    void            *h = NULL;
    memset(x, 0, sizeof *x);
    for (size_t i = 0; i < N_XRT_LIBS && !h; i++) {
        /* RTLD_LOCAL: nothing of it may satisfy a symbol of ours */
        h = sys->dlopen(XRT_LIBS[i], RTLD_LAZY | RTLD_LOCAL);
        const char *e = h ? NULL : sys->dlerror();
        if (i == 0 && e)
            snprintf(first_error, sizeof first_error, "%s", e);
        if (h)
            snprintf(x->library, sizeof x->library, "%s", XRT_LIBS[i]);
    }
    x->found = h != NULL;
    if (h) {
        read_version(h, x);
        sys->dlclose(h);
    }
    reason_of(x, first_error[0] ? first_error : "not found");
}
