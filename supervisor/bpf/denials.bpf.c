// SPDX-License-Identifier: Apache-2.0
// The denial observer (issue 27): one raw tracepoint on every syscall's
// exit. It returns at once unless the syscall failed with a refusal errno
// (or learn mode is on), the caller is in a registered turn cgroup (by its
// cgroup v2 id) and the syscall is one that names a path. Then it counts the
// refusal in `seen` (keyed by turn, syscall, errno and a hash of the path),
// and only the first of each key goes to user space over the ring buffer,
// with the path as passed and, for a relative one, the directory it is
// relative to, walked up dentry by dentry across mounts.
//
// `lsm_denied` is filled by nothing yet: fentry/fexit and BPF LSM programs
// fail to load on these hosts (EPERM, trampolines refused), so an EACCES is
// attributed to Landlock in user space (the file's mode bits would have
// allowed it). Kept so an exact attribution can be added where they load.
//
// Types are declared here, minimally, with CO-RE relocations: no vmlinux.h.

typedef unsigned char __u8;
typedef unsigned short __u16;
typedef unsigned int __u32;
typedef unsigned long long __u64;
typedef signed int __s32;
typedef long long __s64;
typedef __u32 __be32;
typedef __u64 __be64;
typedef __u16 __be16;
typedef __u32 __wsum;

#include <linux/bpf.h>
#include <bpf/bpf_helpers.h>
#include <bpf/bpf_core_read.h>
#include <bpf/bpf_tracing.h>

char LICENSE[] SEC("license") = "GPL";

#define PATH_MAX_B 256
#define COMP_MAX 32
#define COMP_LEN 48

#define EPERM 1
#define ENOENT 2
#define EACCES 13
#define EXDEV 18
#define EROFS 30
#define AT_FDCWD -100

struct qstr {
	const unsigned char *name;
} __attribute__((preserve_access_index));

struct dentry {
	struct dentry *d_parent;
	struct qstr d_name;
} __attribute__((preserve_access_index));

struct vfsmount {
	struct dentry *mnt_root;
} __attribute__((preserve_access_index));

struct mount {
	struct mount *mnt_parent;
	struct dentry *mnt_mountpoint;
	struct vfsmount mnt;
} __attribute__((preserve_access_index));

struct path {
	struct vfsmount *mnt;
	struct dentry *dentry;
} __attribute__((preserve_access_index));

struct fs_struct {
	struct path root;
	struct path pwd;
} __attribute__((preserve_access_index));

struct file {
	struct path f_path;
} __attribute__((preserve_access_index));

struct fdtable {
	struct file **fd;
	unsigned int max_fds;
} __attribute__((preserve_access_index));

struct files_struct {
	struct fdtable *fdt;
} __attribute__((preserve_access_index));

struct task_struct {
	struct fs_struct *fs;
	struct files_struct *files;
} __attribute__((preserve_access_index));

#if defined(__TARGET_ARCH_x86)
struct pt_regs {
	unsigned long di;
	unsigned long si;
	unsigned long dx;
	unsigned long r10;
	unsigned long r8;
	unsigned long orig_ax;
} __attribute__((preserve_access_index));
#define ARG0(r) BPF_CORE_READ(r, di)
#define ARG1(r) BPF_CORE_READ(r, si)
#define ARG2(r) BPF_CORE_READ(r, dx)
#define ARG3(r) BPF_CORE_READ(r, r10)
#define NR(r) BPF_CORE_READ(r, orig_ax)
#elif defined(__TARGET_ARCH_arm64)
struct user_pt_regs {
	__u64 regs[31];
} __attribute__((preserve_access_index));
struct pt_regs {
	struct user_pt_regs user_regs;
	__u64 orig_x0;
	__s32 syscallno;
} __attribute__((preserve_access_index));
#define ARG0(r) BPF_CORE_READ(r, orig_x0)
#define ARG1(r) BPF_CORE_READ(r, user_regs.regs[1])
#define ARG2(r) BPF_CORE_READ(r, user_regs.regs[2])
#define ARG3(r) BPF_CORE_READ(r, user_regs.regs[3])
#define NR(r) BPF_CORE_READ(r, syscallno)
#else
#error "unsupported architecture"
#endif

/* What a registered turn asks for (value of `turns`). */
struct turn {
	__u32 learn;
	__u32 slot; /* its supervisor's ring, in `rings` */
	__u64 dropped;
	/* Refusals whose path could not be read from the process's memory at
	 * the syscall's exit (a page not resident then: being migrated,
	 * reclaimed): counted, never recorded under a wrong path. */
	__u64 unreadable;
};

struct key {
	__u64 cgid;
	__u64 hash;
	__s32 nr;
	__s32 err;
};

struct event {
	__u64 cgid;
	__u64 hash;
	__u64 ts;
	__s32 nr;
	__s32 err;
	__u32 pid;
	__u32 tid;
	__s32 dirfd;
	__u32 flags;
	__u32 lsm;
	__u32 ncomp;
	char path[PATH_MAX_B];
	char path2[PATH_MAX_B];
	char comp[COMP_MAX][COMP_LEN];
};

struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, 1024);
	__type(key, __u64);
	__type(value, struct turn);
} turns SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_LRU_HASH);
	__uint(max_entries, 16384);
	__type(key, struct key);
	__type(value, __u64);
} seen SEC(".maps");

/* tid -> the LSM hook (1-based) that refused its current operation. */
struct {
	__uint(type, BPF_MAP_TYPE_LRU_HASH);
	__uint(max_entries, 4096);
	__type(key, __u32);
	__type(value, __u32);
} lsm_denied SEC(".maps");

/* The supervisors' ring buffers, by slot: the program and these maps are
 * shared by every supervisor on the host (pinned, see observe.rs); each
 * supervisor holds one slot and reads only its ring. A slot's ring
 * outlives its supervisor and is adopted by the next one to take the slot
 * (changing this map waits for an RCU grace period: ~10 ms). */
struct ring {
	__uint(type, BPF_MAP_TYPE_RINGBUF);
	__uint(max_entries, 1 << 20);
};

struct {
	__uint(type, BPF_MAP_TYPE_HASH_OF_MAPS);
	__uint(max_entries, 1024);
	__type(key, __u32);
	__array(values, struct ring);
} rings SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, struct event);
} scratch SEC(".maps");

/* Turns registered in learn mode (successful operations are reported). */
volatile __u32 learners = 0;

/* Which argument holds the path (and the dirfd, and a second path) of each
 * syscall the observer knows; 0 for the others. Encoded: bits 0-2 path arg,
 * 3-5 dirfd arg (7 = none: AT_FDCWD), 6-8 second path arg (7 = none),
 * 9-11 flags arg (7 = none), bit 12 flags are openat2's struct open_how. */
#define SPEC(p, d, p2, f) ((p) | ((d) << 3) | ((p2) << 6) | ((f) << 9))
#define NONE 7
/* A probe (stat, access, readlink): its ENOENT says nothing (user space
 * records no violation for it), so it is dropped here, before any work. */
#define PROBE (1 << 13)

static __always_inline __u32 spec_of(long nr)
{
#if defined(__TARGET_ARCH_x86)
	switch (nr) {
	case 2: return SPEC(0, NONE, NONE, 1);     /* open */
	case 4: case 6: case 21: case 89:
		return SPEC(0, NONE, NONE, NONE) | PROBE; /* stat lstat access readlink */
	case 59: case 76: case 83: case 84: case 87: case 90: case 92: case 94: case 133:
		return SPEC(0, NONE, NONE, NONE); /* execve truncate mkdir rmdir unlink chmod chown lchown mknod */
	case 85: return SPEC(0, NONE, NONE, NONE); /* creat */
	case 82: case 86: return SPEC(0, NONE, 1, NONE); /* rename link */
	case 88: return SPEC(1, NONE, 0, NONE);    /* symlink */
	case 257: return SPEC(1, 0, NONE, 2);      /* openat */
	case 437: return SPEC(1, 0, NONE, 2) | (1 << 12); /* openat2 */
	case 262: case 267: case 269: case 332: case 439:
		return SPEC(1, 0, NONE, NONE) | PROBE; /* newfstatat readlinkat faccessat statx faccessat2 */
	case 258: case 259: case 260: case 263: case 268: case 322: case 452:
		return SPEC(1, 0, NONE, NONE);
	case 264: case 265: case 316: return SPEC(1, 0, 3, NONE); /* renameat linkat renameat2 */
	case 266: return SPEC(2, 1, 0, NONE);      /* symlinkat */
	}
#elif defined(__TARGET_ARCH_arm64)
	switch (nr) {
	case 56: return SPEC(1, 0, NONE, 2);       /* openat */
	case 437: return SPEC(1, 0, NONE, 2) | (1 << 12);
	case 48: case 439: case 79: case 291: case 78:
		return SPEC(1, 0, NONE, NONE) | PROBE; /* faccessat faccessat2 newfstatat statx readlinkat */
	case 33: case 34: case 35: case 53: case 54: case 281: case 452:
		return SPEC(1, 0, NONE, NONE);     /* mknodat mkdirat unlinkat fchmodat fchownat execveat fchmodat2 */
	case 221: case 45: return SPEC(0, NONE, NONE, NONE); /* execve truncate */
	case 38: case 37: case 276: return SPEC(1, 0, 3, NONE); /* renameat linkat renameat2 */
	case 36: return SPEC(2, 1, 0, NONE);       /* symlinkat */
	}
#endif
	return 0;
}

static __always_inline unsigned long arg_of(struct pt_regs *r, __u32 i)
{
	switch (i) {
	case 0: return ARG0(r);
	case 1: return ARG1(r);
	case 2: return ARG2(r);
	case 3: return ARG3(r);
	}
	return 0;
}

/* Walks a dentry up to the task's root (or the mount tree's top), one
 * name per component, leaf first; one step per bpf_loop iteration. */
struct walk_ctx {
	struct event *e;
	struct dentry *d;
	struct vfsmount *m;
	struct dentry *root_d;
	struct vfsmount *root_m;
	__u32 n;
};

static long walk_step(__u32 i, void *arg)
{
	struct walk_ctx *w = arg;
	struct dentry *d = w->d;
	struct vfsmount *m = w->m;
	if (d == w->root_d && m == w->root_m)
		return 1;
	struct dentry *mroot = BPF_CORE_READ(m, mnt_root);
	if (d == mroot) {
		struct mount *mnt = (void *)m - bpf_core_field_offset(struct mount, mnt);
		struct mount *parent = BPF_CORE_READ(mnt, mnt_parent);
		if (parent == mnt)
			return 1;
		w->d = BPF_CORE_READ(mnt, mnt_mountpoint);
		w->m = (void *)parent + bpf_core_field_offset(struct mount, mnt);
		return 0;
	}
	struct dentry *up = BPF_CORE_READ(d, d_parent);
	if (up == d)
		return 1;
	__u32 n = w->n;
	if (n >= COMP_MAX) {
		w->n |= 0x80000000u;
		return 1;
	}
	const unsigned char *name = BPF_CORE_READ(d, d_name.name);
	bpf_probe_read_kernel_str(w->e->comp[n & (COMP_MAX - 1)], COMP_LEN, name);
	w->n = n + 1;
	w->d = up;
	return 0;
}

struct hash_ctx {
	const char *s;
	__u64 h;
};

static long hash_step(__u32 i, void *arg)
{
	struct hash_ctx *c = arg;
	if (i >= PATH_MAX_B)
		return 1;
	char ch = c->s[i & (PATH_MAX_B - 1)];
	if (!ch)
		return 1;
	c->h ^= (unsigned char)ch;
	c->h *= 0x100000001b3ULL;
	return 0;
}

SEC("raw_tp/sys_exit")
int observe_exit(struct bpf_raw_tracepoint_args *ctx)
{
	long ret = (long)ctx->args[1];
	int err = 0;
	if (ret < 0) {
		err = (int)-ret;
		if (err != EACCES && err != EROFS && err != ENOENT && err != EPERM && err != EXDEV)
			return 0;
	} else if (!learners) {
		return 0;
	}
	__u64 cg = bpf_get_current_cgroup_id();
	struct turn *t = bpf_map_lookup_elem(&turns, &cg);
	if (!t)
		return 0;
	if (err == 0 && !t->learn)
		return 0;
	struct pt_regs *regs = (struct pt_regs *)ctx->args[0];
	long nr = NR(regs);
	__u32 spec = spec_of(nr);
	if (!spec || (err == ENOENT && (spec & PROBE)))
		return 0;
	__u32 tid = (__u32)bpf_get_current_pid_tgid();
	__u32 lsm = 0;
	__u32 *l = bpf_map_lookup_elem(&lsm_denied, &tid);
	if (l) {
		lsm = *l;
		bpf_map_delete_elem(&lsm_denied, &tid);
	}
	__u32 zero = 0;
	struct event *e = bpf_map_lookup_elem(&scratch, &zero);
	if (!e)
		return 0;
	e->cgid = cg;
	e->nr = (int)nr;
	e->err = err;
	e->lsm = lsm;
	e->ncomp = 0;
	e->flags = 0;
	e->path[0] = 0;
	e->path2[0] = 0;
	__u32 pa = spec & 7, da = (spec >> 3) & 7, p2 = (spec >> 6) & 7, fa = (spec >> 9) & 7;
	/* A failed read leaves the buffer empty, which would resolve to the
	 * directory the path was relative to: such a refusal is counted apart
	 * instead (a learning turn's successful operation is just lost). */
	if (bpf_probe_read_user_str(e->path, PATH_MAX_B, (void *)arg_of(regs, pa)) < 0) {
		if (err)
			__sync_fetch_and_add(&t->unreadable, 1);
		return 0;
	}
	/* An empty path names nothing (ENOENT, or an fd's AT_EMPTY_PATH
	 * operation): no path refusal. */
	if (!e->path[0])
		return 0;
	if (p2 != NONE &&
	    bpf_probe_read_user_str(e->path2, PATH_MAX_B, (void *)arg_of(regs, p2)) < 0) {
		if (err)
			__sync_fetch_and_add(&t->unreadable, 1);
		return 0;
	}
	e->dirfd = da == NONE ? AT_FDCWD : (int)arg_of(regs, da);
	if (fa != NONE) {
		if (spec & (1 << 12)) {
			__u64 how = 0;
			bpf_probe_read_user(&how, sizeof(how), (void *)arg_of(regs, fa));
			e->flags = (__u32)how;
		} else {
			e->flags = (__u32)arg_of(regs, fa);
		}
	}
	struct task_struct *task = (struct task_struct *)bpf_get_current_task();
	struct dentry *base = 0;
	struct vfsmount *base_m = 0;
	if (e->path[0] != '/') {
		if (e->dirfd == AT_FDCWD) {
			base = BPF_CORE_READ(task, fs, pwd.dentry);
			base_m = BPF_CORE_READ(task, fs, pwd.mnt);
		} else {
			struct fdtable *fdt = BPF_CORE_READ(task, files, fdt);
			unsigned int max = BPF_CORE_READ(fdt, max_fds);
			if ((unsigned int)e->dirfd < max) {
				struct file **fds = BPF_CORE_READ(fdt, fd);
				struct file *f = 0;
				bpf_probe_read_kernel(&f, sizeof(f), &fds[e->dirfd]);
				if (f) {
					base = BPF_CORE_READ(f, f_path.dentry);
					base_m = BPF_CORE_READ(f, f_path.mnt);
				}
			}
		}
	}
	struct hash_ctx hc = {.s = e->path, .h = 0xcbf29ce484222325ULL};
	bpf_loop(PATH_MAX_B, hash_step, &hc, 0);
	hc.s = e->path2;
	hc.h ^= 0xff;
	bpf_loop(PATH_MAX_B, hash_step, &hc, 0);
	__u64 h = hc.h;
	h ^= (__u64)base * 0x9e3779b97f4a7c15ULL;
	h ^= (__u64)e->flags << 1;
	e->hash = h;
	struct key k = {.cgid = cg, .hash = h, .nr = (int)nr, .err = err};
	__u64 *count = bpf_map_lookup_elem(&seen, &k);
	if (count) {
		__sync_fetch_and_add(count, 1);
		return 0;
	}
	__u64 one = 1;
	bpf_map_update_elem(&seen, &k, &one, BPF_NOEXIST);
	if (base) {
		struct fs_struct *fs = BPF_CORE_READ(task, fs);
		struct walk_ctx w = {.e = e, .d = base, .m = base_m,
				     .root_d = BPF_CORE_READ(fs, root.dentry),
				     .root_m = BPF_CORE_READ(fs, root.mnt)};
		if (bpf_loop(COMP_MAX + 16, walk_step, &w, 0) == COMP_MAX + 16)
			w.n |= 0x80000000u;
		e->ncomp = w.n;
	}
	__u64 pt = bpf_get_current_pid_tgid();
	e->pid = pt >> 32;
	e->tid = (__u32)pt;
	e->ts = bpf_ktime_get_ns();
	void *ring = bpf_map_lookup_elem(&rings, &t->slot);
	if (!ring || bpf_ringbuf_output(ring, e, sizeof(*e), 0))
		__sync_fetch_and_add(&t->dropped, 1);
	return 0;
}

struct linux_binprm {
	const char *filename;
	const char *interp;
} __attribute__((preserve_access_index));

/* Learn mode: every program a learning turn executes (a successful execve
 * leaves no path to read at its syscall's exit). `nr` is -1. */
SEC("raw_tp/sched_process_exec")
int observe_exec(struct bpf_raw_tracepoint_args *ctx)
{
	if (!learners)
		return 0;
	__u64 cg = bpf_get_current_cgroup_id();
	struct turn *t = bpf_map_lookup_elem(&turns, &cg);
	if (!t || !t->learn)
		return 0;
	__u32 zero = 0;
	struct event *e = bpf_map_lookup_elem(&scratch, &zero);
	if (!e)
		return 0;
	struct linux_binprm *bprm = (struct linux_binprm *)ctx->args[2];
	e->cgid = cg;
	e->nr = -1;
	e->err = 0;
	e->lsm = 0;
	e->ncomp = 0;
	e->flags = 0;
	e->dirfd = AT_FDCWD;
	bpf_probe_read_kernel_str(e->path, PATH_MAX_B, BPF_CORE_READ(bprm, filename));
	/* A script's interpreter (the same as filename for a binary). */
	bpf_probe_read_kernel_str(e->path2, PATH_MAX_B, BPF_CORE_READ(bprm, interp));
	struct hash_ctx hc = {.s = e->path, .h = 0x84222325cbf29ce4ULL};
	bpf_loop(PATH_MAX_B, hash_step, &hc, 0);
	e->hash = hc.h;
	struct key k = {.cgid = cg, .hash = hc.h, .nr = -1, .err = 0};
	__u64 *count = bpf_map_lookup_elem(&seen, &k);
	if (count) {
		__sync_fetch_and_add(count, 1);
		return 0;
	}
	__u64 one = 1;
	bpf_map_update_elem(&seen, &k, &one, BPF_NOEXIST);
	if (e->path[0] != '/') {
		struct task_struct *task = (struct task_struct *)bpf_get_current_task();
		struct fs_struct *fs = BPF_CORE_READ(task, fs);
		struct walk_ctx w = {.e = e,
				     .d = BPF_CORE_READ(fs, pwd.dentry),
				     .m = BPF_CORE_READ(fs, pwd.mnt),
				     .root_d = BPF_CORE_READ(fs, root.dentry),
				     .root_m = BPF_CORE_READ(fs, root.mnt)};
		bpf_loop(COMP_MAX + 16, walk_step, &w, 0);
		e->ncomp = w.n;
	}
	__u64 pt = bpf_get_current_pid_tgid();
	e->pid = pt >> 32;
	e->tid = (__u32)pt;
	e->ts = bpf_ktime_get_ns();
	void *ring = bpf_map_lookup_elem(&rings, &t->slot);
	if (!ring || bpf_ringbuf_output(ring, e, sizeof(*e), 0))
		__sync_fetch_and_add(&t->dropped, 1);
	return 0;
}
