/* The compiled launch path: a prepared call's signature lookup and its launches in C.

   A Table maps the signature of a call (computed here from the call's arguments, as the
   Python path computes it) to a Program: the launches a prepared call makes, described once
   by Python as byte-level parameter operations (a constant, an argument's device pointer, an
   argument as a double, a TMA tensor map whose global address is the argument's pointer).
   A call that finds its Program reads the arrays' pointers, allocates the outputs not given
   (through the framework's allocator), checks that the outputs given do not overlap the
   inputs, packs the parameters and calls cuLaunchKernel on the framework's current stream.
   Anything this file cannot decide (an argument type it does not know, a scalar that is not
   a number, no current CUDA context) returns MISS, and the caller takes the Python path,
   which validates and says what is wrong.

   The CUDA driver is opened with dlopen at the first launch: building this file needs no CUDA
   headers or libraries, and importing it works on a machine without a GPU. */

#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <dlfcn.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#define MAX_ARGS 32
#define MAX_STEPS 12
#define MAX_RETURNS 8
#define MAX_PARAMS 64
#define MAX_PARAM_BYTES 8192
#define MAX_KEY 256
#define ITEMS_PER_ARRAY 6
#define NO_ARG 255   /* a tensor map of no argument: its bytes as given */

enum { KIND_NONE = 0, KIND_CUPY = 1, KIND_TORCH = 2 };
/* how a table reads each argument into the signature */
enum { ARG_ARRAY = 'A', ARG_VALUE = 'V', ARG_TYPE = 'T', ARG_TYPE_ZERO = 'Z' };
/* parameter operations */
enum { OP_CONST = 0, OP_PTR = 1, OP_F64 = 2, OP_TMAP = 3 };

typedef int CUresult;
typedef CUresult (*launch_fn)(void *, unsigned, unsigned, unsigned, unsigned, unsigned,
                              unsigned, unsigned, void *, void **, void **);
typedef CUresult (*replace_fn)(void *, void *);
typedef CUresult (*ctx_device_fn)(int *);
typedef CUresult (*ctx_current_fn)(void **);

static launch_fn cu_launch;
static replace_fn cu_replace_address;
static ctx_device_fn cu_ctx_get_device;
static ctx_current_fn cu_ctx_get_current;
static int driver_state; /* 0: not tried, 1: loaded, -1: failed */
static char driver_error[256];

static PyObject *MISS;      /* returned when the caller must take the Python path */
static PyObject *kinds;     /* type -> KIND_* (a dict) */
static PyObject *s_data, *s_ptr, *s_device_id, *s_shape, *s_strides, *s_dtype, *s_data_ptr,
    *s_get_device, *s_stride;
static PyObject *small_ints[17];

static int load_driver(void) {
    if (driver_state)
        return driver_state > 0;
    void *lib = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
    if (!lib) {
        snprintf(driver_error, sizeof driver_error, "libcuda.so.1: %s", dlerror());
        driver_state = -1;
        return 0;
    }
    cu_launch = (launch_fn)dlsym(lib, "cuLaunchKernel");
    cu_replace_address = (replace_fn)dlsym(lib, "cuTensorMapReplaceAddress");
    cu_ctx_get_device = (ctx_device_fn)dlsym(lib, "cuCtxGetDevice");
    cu_ctx_get_current = (ctx_current_fn)dlsym(lib, "cuCtxGetCurrent");
    if (!cu_launch || !cu_ctx_get_device || !cu_ctx_get_current) {
        snprintf(driver_error, sizeof driver_error, "libcuda.so.1 lacks cuLaunchKernel, "
                 "cuCtxGetCurrent or cuCtxGetDevice");
        driver_state = -1;
        return 0;
    }
    driver_state = 1;
    return 1;
}

/* ------------------------------------------------------------------ reading arrays */

/* dtypes by identity: an array's dtype goes into a signature as its index here (a dtype's own
   hash is computed afresh by NumPy at every call). The objects are held, so an index never
   names two; another object equal to a known one gets an index of its own (its calls are
   prepared separately), and past MAX_DTYPES new ones take the Python path. */
#define MAX_DTYPES 64
static PyObject *dtypes[MAX_DTYPES];
static int ndtypes;

static PyObject *dtype_index(PyObject *dtype) {
    for (int i = 0; i < ndtypes; i++)
        if (dtypes[i] == dtype)
            return PyLong_FromLong(i);
    if (ndtypes == MAX_DTYPES)
        return Py_NewRef(Py_None);
    dtypes[ndtypes] = Py_NewRef(dtype);
    return PyLong_FromLong(ndtypes++);
}

/* The kind of x's type, KIND_NONE for None, -1 for a type no call has registered. */
static int kind_of(PyObject *x) {
    if (x == Py_None)
        return KIND_NONE;
    PyObject *k = PyDict_GetItemWithError(kinds, (PyObject *)Py_TYPE(x));
    if (!k)
        return -1;
    return (int)PyLong_AsLong(k);
}

static int read_u64(PyObject *o, uint64_t *out) {
    if (!o)
        return -1;
    unsigned long long v = PyLong_AsUnsignedLongLong(o);
    Py_DECREF(o);
    if (v == (unsigned long long)-1 && PyErr_Occurred())
        return -1;
    *out = (uint64_t)v;
    return 0;
}

/* x's device pointer. 0 on success, -1 with an exception set. */
static int array_ptr(PyObject *x, int kind, uint64_t *ptr) {
    if (kind == KIND_CUPY) {
        PyObject *data = PyObject_GetAttr(x, s_data);
        if (!data)
            return -1;
        int r = read_u64(PyObject_GetAttr(data, s_ptr), ptr);
        Py_DECREF(data);
        return r;
    }
    return read_u64(PyObject_CallMethodNoArgs(x, s_data_ptr), ptr);
}

/* x's pointer, and its ITEMS_PER_ARRAY signature items (new references) in items:
   type, shape, strides, dtype, device, pointer & 15. Returns 1 on success, 0 when x can have no
   prepared call (a tensor on the CPU), -1 with an exception set. */
static int read_array(PyObject *x, int kind, uint64_t *ptr, PyObject **items) {
    PyObject *shape = NULL, *strides = NULL, *dtype = NULL, *device = NULL;
    if (kind == KIND_CUPY) {
        PyObject *data = PyObject_GetAttr(x, s_data);
        if (!data)
            return -1;
        if (read_u64(PyObject_GetAttr(data, s_ptr), ptr) < 0) {
            Py_DECREF(data);
            return -1;
        }
        device = PyObject_GetAttr(data, s_device_id);
        Py_DECREF(data);
        if (!device)
            return -1;
        strides = PyObject_GetAttr(x, s_strides);
    } else {
        device = PyObject_CallMethodNoArgs(x, s_get_device);
        if (!device)
            return -1;
        long d = PyLong_AsLong(device);
        if (d < 0) {
            Py_DECREF(device);
            if (PyErr_Occurred())
                return -1;
            return 0;
        }
        if (read_u64(PyObject_CallMethodNoArgs(x, s_data_ptr), ptr) < 0) {
            Py_DECREF(device);
            return -1;
        }
        strides = PyObject_CallMethodNoArgs(x, s_stride);
    }
    shape = PyObject_GetAttr(x, s_shape);
    dtype = PyObject_GetAttr(x, s_dtype);
    if (dtype)
        Py_SETREF(dtype, dtype_index(dtype));
    if (dtype == Py_None) {
        Py_DECREF(dtype);
        Py_XDECREF(shape);
        Py_XDECREF(strides);
        Py_DECREF(device);
        return 0;
    }
    if (!shape || !strides || !dtype) {
        Py_XDECREF(shape);
        Py_XDECREF(strides);
        Py_XDECREF(dtype);
        Py_DECREF(device);
        return -1;
    }
    Py_INCREF(Py_TYPE(x));
    items[0] = (PyObject *)Py_TYPE(x);
    items[1] = shape;
    items[2] = strides;
    items[3] = dtype;
    items[4] = device;
    items[5] = Py_NewRef(small_ints[*ptr & 15]);
    return 1;
}

/* ------------------------------------------------------------------ Table */

typedef struct {
    PyObject_HEAD
    vectorcallfunc vectorcall;
    PyObject *name;
    PyObject *programs; /* signature -> Program */
    char roles[MAX_ARGS];
    Py_ssize_t nargs;
    Py_ssize_t limit;
    unsigned long long hits, misses;
} Table;

/* The signature of args (a new tuple), with the arrays' pointers in ptrs and their kind in
   *kind; Py_None when the call can have no signature (the caller takes the Python path);
   NULL with an exception set. */
static PyObject *signature(Table *t, PyObject *const *args, Py_ssize_t nargs, uint64_t *ptrs,
                           int *kind, int need_device) {
    if (nargs != t->nargs) {
        PyErr_Format(PyExc_TypeError, "%U: expected %zd arguments, got %zd", t->name, t->nargs,
                     nargs);
        return NULL;
    }
    PyObject *items[MAX_KEY];
    Py_ssize_t n = 0;
    int fw = KIND_NONE;
    for (Py_ssize_t i = 0; i < nargs; i++) {
        PyObject *x = args[i];
        ptrs[i] = 0;
        switch (t->roles[i]) {
        case ARG_ARRAY: {
            int k = kind_of(x);
            if (k == KIND_NONE) {
                items[n++] = Py_NewRef(Py_None);
                break;
            }
            if (k < 0 || (fw != KIND_NONE && k != fw))
                goto none;
            fw = k;
            int r = read_array(x, k, &ptrs[i], items + n);
            if (r < 0)
                goto error;
            if (r == 0)
                goto none;
            n += ITEMS_PER_ARRAY;
            break;
        }
        case ARG_VALUE: /* by type and value: 1 is not True, nor 1.0 (equal, and hashed
                           alike, they would find each other's programs) */
            items[n++] = Py_NewRef((PyObject *)Py_TYPE(x));
            items[n++] = Py_NewRef(x);
            break;
        case ARG_TYPE:
            items[n++] = Py_NewRef((PyObject *)Py_TYPE(x));
            break;
        case ARG_TYPE_ZERO: {
            items[n++] = Py_NewRef((PyObject *)Py_TYPE(x));
            int z = PyObject_RichCompareBool(x, small_ints[0], Py_EQ);
            if (z < 0) {
                PyErr_Clear();
                goto none;
            }
            items[n++] = Py_NewRef(z ? Py_True : Py_False);
            break;
        }
        }
    }
    if (fw == KIND_NONE)
        goto none;
    int device = -1;
    void *ctx = NULL;
    /* a thread without a current context (an autograd worker's first call): asked first, so
       that no driver call fails (cuCtxGetDevice would, and compute-sanitizer reports it) */
    if (!load_driver() || cu_ctx_get_current(&ctx) != 0 || !ctx ||
        cu_ctx_get_device(&device) != 0) {
        if (need_device)
            goto none;   /* no current context: the Python path makes one current */
        device = -1;
    }
    items[n++] = PyLong_FromLong(device);
    if (!items[n - 1]) {
        n--;
        goto error;
    }
    PyObject *key = PyTuple_New(n);
    if (!key)
        goto error;
    for (Py_ssize_t j = 0; j < n; j++)
        PyTuple_SET_ITEM(key, j, items[j]);
    if (PyObject_Hash(key) == -1) {   /* an argument that is not hashable */
        Py_DECREF(key);
        if (!PyErr_ExceptionMatches(PyExc_TypeError))
            return NULL;
        PyErr_Clear();
        Py_RETURN_NONE;
    }
    *kind = fw;
    return key;
none:
    for (Py_ssize_t j = 0; j < n; j++)
        Py_DECREF(items[j]);
    Py_RETURN_NONE;
error:
    for (Py_ssize_t j = 0; j < n; j++)
        Py_DECREF(items[j]);
    return NULL;
}

/* ------------------------------------------------------------------ Program */

typedef struct {
    uint32_t offset;
    uint8_t op;
    uint8_t arg;
    uint64_t value;          /* OP_CONST: the bytes; OP_PTR: a byte offset added */
    unsigned char *map;      /* OP_TMAP: 64-byte aligned, 128 bytes */
    uint64_t map_address;    /* the address map holds */
} Op;

typedef struct {
    void *function;
    unsigned grid[3], block[3], smem;
    uint32_t nbytes;
    int nparams;
    uint32_t param_offsets[MAX_PARAMS];
    int nops;
    Op *ops;
} Step;

typedef struct {
    uint8_t out, in, same_ok;
    int64_t olo, ohi, ilo, ihi;
} Pair;

typedef struct {
    PyObject_HEAD
    vectorcallfunc vectorcall;
    int kind;
    int nsteps;
    Step steps[MAX_STEPS];
    int nallocs;
    uint8_t alloc_arg[MAX_ARGS];
    PyObject *alloc_fn[MAX_ARGS];
    PyObject *alloc_shape[MAX_ARGS];
    int npairs;
    Pair *pairs;
    PyObject *overlap;     /* overlap(ptrs tuple): raises the overlap's error */
    PyObject *stream;      /* stream() -> int */
    PyObject *failed;      /* failed(status) -> True to launch once more, else raises */
    int nslots;            /* arguments and the slots after them (intermediates, outputs) */
    int nreturns;
    uint8_t returns[MAX_RETURNS];
    void *map_storage;
    PyObject *describe;    /* the description it was made from */
} Program;

static PyTypeObject ProgramType;
static PyObject *program_call(PyObject *, PyObject *const *, size_t, PyObject *);

static void program_dealloc(Program *p) {
    for (int s = 0; s < p->nsteps; s++)
        PyMem_Free(p->steps[s].ops);
    for (int i = 0; i < p->nallocs; i++) {
        Py_XDECREF(p->alloc_fn[i]);
        Py_XDECREF(p->alloc_shape[i]);
    }
    PyMem_Free(p->pairs);
    PyMem_Free(p->map_storage);
    Py_XDECREF(p->overlap);
    Py_XDECREF(p->stream);
    Py_XDECREF(p->failed);
    Py_XDECREF(p->describe);
    Py_TYPE(p)->tp_free((PyObject *)p);
}

static int as_u32(PyObject *o, uint32_t *v, const char *what) {
    unsigned long x = PyLong_AsUnsignedLong(o);
    if (x == (unsigned long)-1 && PyErr_Occurred())
        return -1;
    if (x > 0xffffffffUL) {
        PyErr_Format(PyExc_ValueError, "%s: %lu does not fit 32 bits", what, x);
        return -1;
    }
    *v = (uint32_t)x;
    return 0;
}

static int parse_dim3(PyObject *o, unsigned *d, const char *what) {
    PyObject *t = PySequence_Tuple(o);
    if (!t)
        return -1;
    if (PyTuple_GET_SIZE(t) != 3) {
        Py_DECREF(t);
        PyErr_Format(PyExc_ValueError, "%s: expected 3 numbers", what);
        return -1;
    }
    for (int i = 0; i < 3; i++) {
        uint32_t v;
        if (as_u32(PyTuple_GET_ITEM(t, i), &v, what) < 0) {
            Py_DECREF(t);
            return -1;
        }
        d[i] = v;
    }
    Py_DECREF(t);
    return 0;
}

/* Program(kind, steps, allocs, pairs, overlap, stream, failed, returns[, slots]):
     steps: [(function pointer, grid, block, smem, nbytes, param offsets, ops)], ops:
       [(offset, op, arg, value)] (OP_TMAP's value: the 128 bytes of the map);
     allocs: [(arg, alloc, shape)]: alloc(shape) makes the output of arg when it is None;
     pairs: [(out, olo, ohi, in, ilo, ihi, same_ok)]: byte ranges relative to the pointers;
     returns: the arguments returned (one: itself; several: a tuple);
     slots: the arguments and slots after them, None at each call until an allocation makes
       them (the intermediates and outputs of a program of several launches); default: the
       call's arguments alone. */
static PyObject *program_new(PyTypeObject *type, PyObject *args, PyObject *kw) {
    int kind;
    PyObject *steps, *allocs, *pairs, *overlap, *stream, *failed, *returns;
    int nslots = 0;
    if (kw && PyDict_GET_SIZE(kw)) {
        PyErr_SetString(PyExc_TypeError, "Program takes no keyword arguments");
        return NULL;
    }
    if (!PyArg_ParseTuple(args, "iOOOOOOO|i", &kind, &steps, &allocs, &pairs, &overlap, &stream,
                          &failed, &returns, &nslots))
        return NULL;
    if (nslots < 0 || nslots > MAX_ARGS) {
        PyErr_Format(PyExc_ValueError, "slots: expected 0 to %d, got %d", MAX_ARGS, nslots);
        return NULL;
    }
    Program *p = (Program *)type->tp_alloc(type, 0);
    if (!p)
        return NULL;
    p->vectorcall = program_call;
    p->kind = kind;
    p->nslots = nslots;
    p->overlap = Py_NewRef(overlap);
    p->stream = Py_NewRef(stream);
    p->failed = Py_NewRef(failed);
    p->describe = Py_BuildValue("(OOOO)", steps, allocs, pairs, returns);
    if (!p->describe)
        goto fail;
    PyObject *seq = NULL;
    /* steps */
    seq = PySequence_Fast(steps, "steps: expected a sequence");
    if (!seq)
        goto fail;
    Py_ssize_t nsteps = PySequence_Fast_GET_SIZE(seq);
    if (nsteps < 1 || nsteps > MAX_STEPS) {
        PyErr_Format(PyExc_ValueError, "steps: expected 1 to %d, got %zd", MAX_STEPS, nsteps);
        goto fail_seq;
    }
    Py_ssize_t nmaps = 0;
    for (Py_ssize_t s = 0; s < nsteps; s++) {
        PyObject *ops = PyTuple_Check(PySequence_Fast_GET_ITEM(seq, s))
                            ? PyTuple_GetItem(PySequence_Fast_GET_ITEM(seq, s), 6) : NULL;
        if (!ops) {
            PyErr_SetString(PyExc_ValueError, "steps: expected tuples of 7 items");
            goto fail_seq;
        }
        Py_ssize_t nops = PySequence_Size(ops);
        if (nops < 0)
            goto fail_seq;
        for (Py_ssize_t j = 0; j < nops; j++) {
            PyObject *op = PySequence_GetItem(ops, j);
            if (!op)
                goto fail_seq;
            PyObject *code = PySequence_GetItem(op, 1);
            Py_DECREF(op);
            if (!code)
                goto fail_seq;
            nmaps += PyLong_AsLong(code) == OP_TMAP;
            Py_DECREF(code);
        }
    }
    if (nmaps) {
        p->map_storage = PyMem_Calloc(nmaps * 128 + 64, 1);
        if (!p->map_storage) {
            PyErr_NoMemory();
            goto fail_seq;
        }
    }
    unsigned char *maps = (unsigned char *)(((uintptr_t)p->map_storage + 63) & ~(uintptr_t)63);
    for (Py_ssize_t s = 0; s < nsteps; s++) {
        Step *st = &p->steps[s];
        PyObject *fptr, *grid, *block, *offsets, *ops;
        unsigned long long fp;
        unsigned int smem, nbytes;
        if (!PyArg_ParseTuple(PySequence_Fast_GET_ITEM(seq, s), "OOOIIOO", &fptr, &grid,
                              &block, &smem, &nbytes, &offsets, &ops))
            goto fail_seq;
        fp = PyLong_AsUnsignedLongLong(fptr);
        if (PyErr_Occurred())
            goto fail_seq;
        st->function = (void *)(uintptr_t)fp;
        if (parse_dim3(grid, st->grid, "grid") < 0 || parse_dim3(block, st->block, "block") < 0)
            goto fail_seq;
        st->smem = smem;
        if (nbytes > MAX_PARAM_BYTES) {
            PyErr_Format(PyExc_ValueError, "parameters of %u bytes; at most %d", nbytes,
                         MAX_PARAM_BYTES);
            goto fail_seq;
        }
        st->nbytes = nbytes;
        PyObject *offs = PySequence_Fast(offsets, "offsets: expected a sequence");
        if (!offs)
            goto fail_seq;
        st->nparams = (int)PySequence_Fast_GET_SIZE(offs);
        if (st->nparams > MAX_PARAMS) {
            Py_DECREF(offs);
            PyErr_Format(PyExc_ValueError, "at most %d parameters", MAX_PARAMS);
            goto fail_seq;
        }
        for (int j = 0; j < st->nparams; j++) {
            if (as_u32(PySequence_Fast_GET_ITEM(offs, j), &st->param_offsets[j], "offset") < 0 ||
                st->param_offsets[j] >= nbytes) {
                Py_DECREF(offs);
                if (!PyErr_Occurred())
                    PyErr_SetString(PyExc_ValueError, "a parameter offset past the end");
                goto fail_seq;
            }
        }
        Py_DECREF(offs);
        PyObject *opseq = PySequence_Fast(ops, "ops: expected a sequence");
        if (!opseq)
            goto fail_seq;
        st->nops = (int)PySequence_Fast_GET_SIZE(opseq);
        st->ops = PyMem_Calloc(st->nops ? st->nops : 1, sizeof(Op));
        if (!st->ops) {
            Py_DECREF(opseq);
            PyErr_NoMemory();
            goto fail_seq;
        }
        p->nsteps = (int)s + 1;
        for (int j = 0; j < st->nops; j++) {
            Op *o = &st->ops[j];
            unsigned int offset, code, arg;
            PyObject *value;
            if (!PyArg_ParseTuple(PySequence_Fast_GET_ITEM(opseq, j), "IIIO", &offset, &code,
                                  &arg, &value)) {
                Py_DECREF(opseq);
                goto fail_seq;
            }
            uint32_t width = code == OP_TMAP ? 128 : 8;
            if (offset + width > nbytes || code > OP_TMAP ||
                (arg >= MAX_ARGS && !(code == OP_TMAP && arg == NO_ARG))) {
                Py_DECREF(opseq);
                PyErr_Format(PyExc_ValueError, "op %d: offset %u, code %u or argument %u out "
                             "of range", j, offset, code, arg);
                goto fail_seq;
            }
            o->offset = offset;
            o->op = (uint8_t)code;
            o->arg = (uint8_t)arg;
            if (code == OP_TMAP) {   /* value: (the map's 128 bytes, the address in it) */
                PyObject *blob;
                unsigned long long address;
                char *buf;
                Py_ssize_t len;
                if (!PyArg_ParseTuple(value, "OK", &blob, &address) ||
                    PyBytes_AsStringAndSize(blob, &buf, &len) < 0 || len != 128) {
                    Py_DECREF(opseq);
                    if (!PyErr_Occurred())
                        PyErr_SetString(PyExc_ValueError, "a tensor map: expected 128 bytes");
                    goto fail_seq;
                }
                o->map = maps;
                maps += 128;
                memcpy(o->map, buf, 128);
                o->map_address = address;
            } else if (code == OP_CONST || code == OP_PTR) {
                if (PyFloat_Check(value)) {
                    double d = PyFloat_AS_DOUBLE(value);
                    memcpy(&o->value, &d, 8);
                } else {
                    o->value = PyLong_AsUnsignedLongLongMask(value);
                    if (PyErr_Occurred()) {
                        Py_DECREF(opseq);
                        goto fail_seq;
                    }
                }
            }
        }
        Py_DECREF(opseq);
    }
    Py_DECREF(seq);
    /* allocs */
    seq = PySequence_Fast(allocs, "allocs: expected a sequence");
    if (!seq)
        goto fail;
    if (PySequence_Fast_GET_SIZE(seq) > MAX_ARGS) {
        PyErr_SetString(PyExc_ValueError, "too many allocations");
        goto fail_seq;
    }
    for (Py_ssize_t i = 0; i < PySequence_Fast_GET_SIZE(seq); i++) {
        unsigned int arg;
        PyObject *fn, *shape;
        if (!PyArg_ParseTuple(PySequence_Fast_GET_ITEM(seq, i), "IOO", &arg, &fn, &shape))
            goto fail_seq;
        if (arg >= MAX_ARGS) {
            PyErr_SetString(PyExc_ValueError, "allocation of an argument out of range");
            goto fail_seq;
        }
        p->alloc_arg[i] = (uint8_t)arg;
        p->alloc_fn[i] = Py_NewRef(fn);
        p->alloc_shape[i] = Py_NewRef(shape);
        p->nallocs = (int)i + 1;
    }
    Py_DECREF(seq);
    /* pairs */
    seq = PySequence_Fast(pairs, "pairs: expected a sequence");
    if (!seq)
        goto fail;
    p->npairs = (int)PySequence_Fast_GET_SIZE(seq);
    p->pairs = PyMem_Calloc(p->npairs ? p->npairs : 1, sizeof(Pair));
    if (!p->pairs) {
        PyErr_NoMemory();
        goto fail_seq;
    }
    for (int i = 0; i < p->npairs; i++) {
        unsigned int out, in;
        long long olo, ohi, ilo, ihi;
        int same;
        if (!PyArg_ParseTuple(PySequence_Fast_GET_ITEM(seq, i), "ILLILLp", &out, &olo, &ohi,
                              &in, &ilo, &ihi, &same))
            goto fail_seq;
        if (out >= MAX_ARGS || in >= MAX_ARGS) {
            PyErr_SetString(PyExc_ValueError, "a pair's argument out of range");
            goto fail_seq;
        }
        p->pairs[i] = (Pair){(uint8_t)out, (uint8_t)in, (uint8_t)same, olo, ohi, ilo, ihi};
    }
    Py_DECREF(seq);
    /* returns */
    seq = PySequence_Fast(returns, "returns: expected a sequence");
    if (!seq)
        goto fail;
    p->nreturns = (int)PySequence_Fast_GET_SIZE(seq);
    if (p->nreturns < 1 || p->nreturns > MAX_RETURNS) {
        PyErr_Format(PyExc_ValueError, "returns: expected 1 to %d arguments", MAX_RETURNS);
        goto fail_seq;
    }
    for (int i = 0; i < p->nreturns; i++) {
        long r = PyLong_AsLong(PySequence_Fast_GET_ITEM(seq, i));
        if (r < 0 || r >= MAX_ARGS) {
            if (!PyErr_Occurred())
                PyErr_SetString(PyExc_ValueError, "returns: argument out of range");
            goto fail_seq;
        }
        p->returns[i] = (uint8_t)r;
    }
    Py_DECREF(seq);
    return (PyObject *)p;
fail_seq:
    Py_DECREF(seq);
fail:
    Py_DECREF(p);
    return NULL;
}

/* Pack step s's parameters into buf (64-byte aligned, st->nbytes long). */
static int pack_step(Program *p, Step *st, const uint64_t *ptrs, PyObject *const *args,
                     unsigned char *buf) {
    for (int j = 0; j < st->nops; j++) {
        Op *o = &st->ops[j];
        switch (o->op) {
        case OP_CONST:
            memcpy(buf + o->offset, &o->value, 8);
            break;
        case OP_PTR: {
            uint64_t v = ptrs[o->arg] ? ptrs[o->arg] + o->value : 0;
            memcpy(buf + o->offset, &v, 8);
            break;
        }
        case OP_F64: {
            double d = PyFloat_AsDouble(args[o->arg]);
            if (d == -1.0 && PyErr_Occurred())
                return -1;
            memcpy(buf + o->offset, &d, 8);
            break;
        }
        case OP_TMAP: {
            uint64_t address = o->arg == NO_ARG ? o->map_address : ptrs[o->arg];
            if (address != o->map_address) {
                if (!cu_replace_address) {
                    PyErr_SetString(PyExc_RuntimeError, "cuTensorMapReplaceAddress is "
                                    "missing from the CUDA driver");
                    return -1;
                }
                CUresult r = cu_replace_address(o->map, (void *)(uintptr_t)address);
                if (r != 0) {
                    PyErr_Format(PyExc_RuntimeError, "cuTensorMapReplaceAddress failed "
                                 "(CUresult %d) for address 0x%llx", r,
                                 (unsigned long long)address);
                    return -1;
                }
                o->map_address = address;
            }
            memcpy(buf + o->offset, o->map, 128);
            break;
        }
        }
    }
    (void)p;
    return 0;
}

/* Scalars first (a bad one is the Python path's to report: MISS), then outputs. Fills
   objs (borrowed arguments or owned new outputs, owned flags) and ptrs. 1: go on, 0: MISS,
   -1: error. */
static int check_scalars(Program *p, PyObject *const *args) {
    for (int s = 0; s < p->nsteps; s++)
        for (int j = 0; j < p->steps[s].nops; j++)
            if (p->steps[s].ops[j].op == OP_F64) {
                PyObject *x = args[p->steps[s].ops[j].arg];
                if (PyFloat_CheckExact(x))
                    continue;
                double d = PyFloat_AsDouble(x);
                if (d == -1.0 && PyErr_Occurred()) {
                    PyErr_Clear();
                    return 0;
                }
            }
    return 1;
}

static PyObject *launch_program(Program *p, PyObject *const *call_args, Py_ssize_t nargs,
                                uint64_t *ptrs, int dry) {
    PyObject *made[MAX_ARGS] = {0};
    PyObject *result = NULL;
    /* the arguments, then the slots after them (None until allocated) */
    PyObject *slots[MAX_ARGS];
    PyObject *const *args = call_args;
    if (p->nslots > nargs) {
        for (Py_ssize_t i = 0; i < p->nslots; i++) {
            slots[i] = i < nargs ? call_args[i] : Py_None;
            if (i >= nargs)
                ptrs[i] = 0;
        }
        args = slots;
        nargs = p->nslots;
    }
    int ok = check_scalars(p, args);
    if (ok <= 0)
        return ok < 0 ? NULL : Py_NewRef(MISS);
    for (int i = 0; i < p->nallocs; i++) {
        int a = p->alloc_arg[i];
        if (a >= nargs || args[a] != Py_None)
            continue;
        made[a] = PyObject_CallOneArg(p->alloc_fn[i], p->alloc_shape[i]);
        if (!made[a] || array_ptr(made[a], p->kind, &ptrs[a]) < 0)
            goto done;
    }
    for (int i = 0; i < p->npairs; i++) {
        Pair *q = &p->pairs[i];
        uint64_t o = ptrs[q->out], x = ptrs[q->in];
        if (!o || !x)
            continue;
        if ((int64_t)(o + q->olo) < (int64_t)(x + q->ihi) &&
            (int64_t)(x + q->ilo) < (int64_t)(o + q->ohi) && !(q->same_ok && o == x)) {
            PyObject *t = PyTuple_New(nargs);
            if (!t)
                goto done;
            for (Py_ssize_t j = 0; j < nargs; j++)
                PyTuple_SET_ITEM(t, j, PyLong_FromUnsignedLongLong(ptrs[j]));
            PyObject *r = PyObject_CallOneArg(p->overlap, t);
            Py_DECREF(t);
            Py_XDECREF(r);
            if (r && !PyErr_Occurred())
                PyErr_SetString(PyExc_ValueError, "an output overlaps an input");
            goto done;
        }
    }
    if (dry) {   /* the parameter bytes of every step, for tests */
        result = PyList_New(p->nsteps);
        if (!result)
            goto done;
        for (int s = 0; s < p->nsteps; s++) {
            PyObject *b = PyBytes_FromStringAndSize(NULL, p->steps[s].nbytes);
            if (!b) {
                Py_CLEAR(result);
                goto done;
            }
            memset(PyBytes_AS_STRING(b), 0, p->steps[s].nbytes);
            if (pack_step(p, &p->steps[s], ptrs, args,
                          (unsigned char *)PyBytes_AS_STRING(b)) < 0) {
                Py_DECREF(b);
                Py_CLEAR(result);
                goto done;
            }
            PyList_SET_ITEM(result, s, b);
        }
        goto done;
    }
    if (!load_driver()) {
        PyErr_Format(PyExc_RuntimeError, "the CUDA driver could not be loaded: %s",
                     driver_error);
        goto done;
    }
    PyObject *stream_obj = PyObject_CallNoArgs(p->stream);
    if (!stream_obj)
        goto done;
    uint64_t stream;
    if (read_u64(stream_obj, &stream) < 0)
        goto done;
    _Alignas(64) unsigned char buf[MAX_PARAM_BYTES];
    void *params[MAX_PARAMS];
    for (int s = 0; s < p->nsteps; s++) {
        Step *st = &p->steps[s];
        if (pack_step(p, st, ptrs, args, buf) < 0)
            goto done;
        for (int j = 0; j < st->nparams; j++)
            params[j] = buf + st->param_offsets[j];
        for (int attempt = 0;; attempt++) {
            CUresult r = cu_launch(st->function, st->grid[0], st->grid[1], st->grid[2],
                                   st->block[0], st->block[1], st->block[2], st->smem,
                                   (void *)(uintptr_t)stream, params, NULL);
            if (r == 0)
                break;
            PyObject *status = PyLong_FromLong(r);
            if (!status)
                goto done;
            PyObject *again = PyObject_CallOneArg(p->failed, status);
            Py_DECREF(status);
            if (!again)
                goto done;
            int retry = PyObject_IsTrue(again);
            Py_DECREF(again);
            if (retry < 0)
                goto done;
            if (!retry || attempt) {
                PyErr_Format(PyExc_RuntimeError, "cuLaunchKernel failed (CUresult %d)", r);
                goto done;
            }
        }
    }
    if (p->nreturns == 1) {
        int a = p->returns[0];
        result = Py_NewRef(a >= nargs ? Py_None : made[a] ? made[a] : args[a]);
    } else {
        result = PyTuple_New(p->nreturns);
        if (!result)
            goto done;
        for (int i = 0; i < p->nreturns; i++) {
            int a = p->returns[i];
            PyTuple_SET_ITEM(result, i,
                             Py_NewRef(a >= nargs ? Py_None : made[a] ? made[a] : args[a]));
        }
    }
done:
    for (int i = 0; i < MAX_ARGS; i++)
        Py_XDECREF(made[i]);
    return result;
}

/* program(*args): the program on args as they are, with no signature: for a caller whose own
   signature fixed the pattern (a prepared call that launches another op's prepared call). The
   arrays' pointers are read by the program's kind; other arguments are left to the ops. */
static PyObject *program_call(PyObject *self, PyObject *const *args, size_t nargsf,
                              PyObject *kwnames) {
    Program *p = (Program *)self;
    Py_ssize_t nargs = PyVectorcall_NARGS(nargsf);
    if (kwnames && PyTuple_GET_SIZE(kwnames)) {
        PyErr_SetString(PyExc_TypeError, "a program takes no keyword arguments");
        return NULL;
    }
    if (nargs > MAX_ARGS) {
        PyErr_Format(PyExc_TypeError, "a program takes at most %d arguments", MAX_ARGS);
        return NULL;
    }
    uint64_t ptrs[MAX_ARGS] = {0};
    for (Py_ssize_t i = 0; i < nargs; i++) {
        PyObject *x = args[i];
        int k = kind_of(x);
        if (k == KIND_NONE)
            continue;
        if (k == p->kind) {
            if (array_ptr(x, k, &ptrs[i]) < 0)
                return NULL;
            continue;
        }
        if (PyErr_Occurred())
            return NULL;
        if (k < 0 && (PyFloat_Check(x) || PyLong_Check(x) || PyUnicode_Check(x)))
            continue;   /* a scalar or a name: read by the operations, if at all */
        /* never a launch on a pointer not read */
        PyErr_Format(PyExc_TypeError, "program argument %zd: expected an array of the "
                     "program's framework, got %s", i, Py_TYPE(x)->tp_name);
        return NULL;
    }
    PyObject *r = launch_program(p, args, nargs, ptrs, 0);
    if (r == MISS) {   /* a scalar no double holds: no signature to fall back on */
        Py_DECREF(r);
        PyErr_SetString(PyExc_OverflowError, "a scalar argument does not fit a double");
        return NULL;
    }
    return r;
}

static PyObject *program_describe(Program *p, void *closure) {
    (void)closure;
    return Py_NewRef(p->describe);
}

static PyGetSetDef program_getset[] = {
    {"description", (getter)program_describe, NULL,
     "(steps, allocs, pairs, returns) as given", NULL},
    {NULL},
};

static PyTypeObject ProgramType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "ge2jit.jit._fastlaunch.Program",
    .tp_basicsize = sizeof(Program),
    .tp_dealloc = (destructor)program_dealloc,
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_VECTORCALL,
    .tp_doc = "The launches of one prepared call, as parameter operations; program(*args) "
              "runs them on args with no signature check.",
    .tp_new = program_new,
    .tp_call = PyVectorcall_Call,
    .tp_vectorcall_offset = offsetof(Program, vectorcall),
    .tp_getset = program_getset,
};

/* ------------------------------------------------------------------ Table methods */

static PyObject *table_vectorcall(PyObject *, PyObject *const *, size_t, PyObject *);

static PyObject *table_new(PyTypeObject *type, PyObject *args, PyObject *kw) {
    PyObject *name;
    const char *roles;
    Py_ssize_t limit = 4096;
    static char *names[] = {"name", "roles", "limit", NULL};
    if (!PyArg_ParseTupleAndKeywords(args, kw, "Us|n", names, &name, &roles, &limit))
        return NULL;
    Py_ssize_t n = (Py_ssize_t)strlen(roles);
    if (n < 1 || n > MAX_ARGS) {
        PyErr_Format(PyExc_ValueError, "roles: expected 1 to %d letters", MAX_ARGS);
        return NULL;
    }
    Py_ssize_t arrays = 0, others = 0;
    for (Py_ssize_t i = 0; i < n; i++) {
        char c = roles[i];
        if (c != ARG_ARRAY && c != ARG_VALUE && c != ARG_TYPE && c != ARG_TYPE_ZERO) {
            PyErr_Format(PyExc_ValueError, "roles: expected letters of AVTZ, got %c", c);
            return NULL;
        }
        arrays += c == ARG_ARRAY;
        others += c == ARG_TYPE_ZERO || c == ARG_VALUE ? 2 : c != ARG_ARRAY;
    }
    if (arrays * ITEMS_PER_ARRAY + others + 1 > MAX_KEY) {
        PyErr_SetString(PyExc_ValueError, "roles: too many arguments for a signature");
        return NULL;
    }
    Table *t = (Table *)type->tp_alloc(type, 0);
    if (!t)
        return NULL;
    t->vectorcall = table_vectorcall;
    t->name = Py_NewRef(name);
    t->programs = PyDict_New();
    if (!t->programs) {
        Py_DECREF(t);
        return NULL;
    }
    memcpy(t->roles, roles, n);
    t->nargs = n;
    t->limit = limit < 1 ? 1 : limit;
    return (PyObject *)t;
}

static void table_dealloc(Table *t) {
    Py_XDECREF(t->name);
    Py_XDECREF(t->programs);
    Py_TYPE(t)->tp_free((PyObject *)t);
}

/* table(*args): the call's result, or MISS. */
static PyObject *table_vectorcall(PyObject *self, PyObject *const *args, size_t nargsf,
                                  PyObject *kwnames) {
    Table *t = (Table *)self;
    Py_ssize_t nargs = PyVectorcall_NARGS(nargsf);
    if (kwnames && PyTuple_GET_SIZE(kwnames)) {
        PyErr_Format(PyExc_TypeError, "%U: takes no keyword arguments", t->name);
        return NULL;
    }
    uint64_t ptrs[MAX_ARGS];
    int kind = 0;
    PyObject *key = signature(t, args, nargs, ptrs, &kind, 1);
    if (!key)
        return NULL;
    if (key == Py_None) {
        Py_DECREF(key);
        t->misses++;
        return Py_NewRef(MISS);
    }
    PyObject *prog = PyDict_GetItemWithError(t->programs, key);
    Py_DECREF(key);
    if (!prog) {
        if (PyErr_Occurred())
            return NULL;
        t->misses++;
        return Py_NewRef(MISS);
    }
    Py_INCREF(prog);   /* a clear() during an allocation must not free it under us */
    PyObject *r = launch_program((Program *)prog, args, nargs, ptrs, 0);
    Py_DECREF(prog);
    if (r && r != MISS)
        t->hits++;
    return r;
}

static PyObject *table_key(Table *t, PyObject *const *args, Py_ssize_t nargs) {
    uint64_t ptrs[MAX_ARGS];
    int kind = 0;
    return signature(t, args, nargs, ptrs, &kind, 0);
}

static PyObject *table_pack(Table *t, PyObject *const *args, Py_ssize_t nargs) {
    uint64_t ptrs[MAX_ARGS];
    int kind = 0;
    PyObject *key = signature(t, args, nargs, ptrs, &kind, 0);
    if (!key || key == Py_None)
        return key;
    PyObject *prog = PyDict_GetItemWithError(t->programs, key);
    Py_DECREF(key);
    if (!prog)
        return PyErr_Occurred() ? NULL : Py_NewRef(MISS);
    Py_INCREF(prog);
    PyObject *r = launch_program((Program *)prog, args, nargs, ptrs, 1);
    Py_DECREF(prog);
    return r;
}

static PyObject *table_put(Table *t, PyObject *args) {
    PyObject *key, *prog;
    if (!PyArg_ParseTuple(args, "OO!", &key, &ProgramType, &prog))
        return NULL;
    if (!PyTuple_Check(key)) {
        PyErr_SetString(PyExc_TypeError, "put: expected a signature from key()");
        return NULL;
    }
    if (PyDict_GET_SIZE(t->programs) >= t->limit)
        PyDict_Clear(t->programs);
    if (PyDict_SetItem(t->programs, key, prog) < 0)
        return NULL;
    Py_RETURN_NONE;
}

static PyObject *table_clear(Table *t, PyObject *unused) {
    (void)unused;
    PyDict_Clear(t->programs);
    Py_RETURN_NONE;
}

static PyObject *table_stats(Table *t, PyObject *unused) {
    (void)unused;
    return Py_BuildValue("{s:n,s:K,s:K}", "programs", PyDict_GET_SIZE(t->programs), "hits",
                         t->hits, "misses", t->misses);
}

static Py_ssize_t table_len(Table *t) { return PyDict_GET_SIZE(t->programs); }

static PyObject *table_repr(Table *t) {
    return PyUnicode_FromFormat("<compiled launch table %U: %zd of %zd>", t->name,
                                PyDict_GET_SIZE(t->programs), t->limit);
}

static PyMethodDef table_methods[] = {
    {"key", (PyCFunction)(void (*)(void))table_key, METH_FASTCALL,
     "key(*args): the signature a call on args is stored under, or None"},
    {"pack", (PyCFunction)(void (*)(void))table_pack, METH_FASTCALL,
     "pack(*args): the parameter bytes of each launch the call would make (no launch)"},
    {"put", (PyCFunction)table_put, METH_VARARGS, "put(key, program)"},
    {"clear", (PyCFunction)table_clear, METH_NOARGS, "forget every program"},
    {"stats", (PyCFunction)table_stats, METH_NOARGS, "{programs, hits, misses}"},
    {NULL},
};

static PySequenceMethods table_as_sequence = {.sq_length = (lenfunc)table_len};

static PyTypeObject TableType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "ge2jit.jit._fastlaunch.Table",
    .tp_basicsize = sizeof(Table),
    .tp_dealloc = (destructor)table_dealloc,
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_VECTORCALL,
    .tp_doc = "Table(name, roles, limit=4096): signature -> Program; table(*args) runs the "
              "program of the call's signature, or returns MISS.",
    .tp_new = table_new,
    .tp_call = PyVectorcall_Call,
    .tp_vectorcall_offset = offsetof(Table, vectorcall),
    .tp_methods = table_methods,
    .tp_as_sequence = &table_as_sequence,
    .tp_repr = (reprfunc)table_repr,
};

/* ------------------------------------------------------------------ module */

static PyObject *register_type(PyObject *mod, PyObject *args) {
    (void)mod;
    PyObject *type;
    int kind;
    if (!PyArg_ParseTuple(args, "O!i", &PyType_Type, &type, &kind))
        return NULL;
    if (kind != KIND_CUPY && kind != KIND_TORCH) {
        PyErr_Format(PyExc_ValueError, "kind: expected %d (CuPy) or %d (PyTorch), got %d",
                     KIND_CUPY, KIND_TORCH, kind);
        return NULL;
    }
    PyObject *k = PyLong_FromLong(kind);
    if (!k || PyDict_SetItem(kinds, type, k) < 0) {
        Py_XDECREF(k);
        return NULL;
    }
    Py_DECREF(k);
    Py_RETURN_NONE;
}

static PyObject *set_miss(PyObject *mod, PyObject *obj) {
    (void)mod;
    Py_SETREF(MISS, Py_NewRef(obj));
    Py_RETURN_NONE;
}

static PyObject *driver(PyObject *mod, PyObject *unused) {
    (void)mod;
    (void)unused;
    if (load_driver())
        Py_RETURN_NONE;
    return PyUnicode_FromString(driver_error);
}

static PyMethodDef module_methods[] = {
    {"register_type", register_type, METH_VARARGS,
     "register_type(type, kind): arrays of type are read as CuPy's (1) or PyTorch's (2)"},
    {"set_miss", set_miss, METH_O, "set_miss(obj): what a call that misses returns"},
    {"driver", driver, METH_NOARGS,
     "load the CUDA driver: None, or why it could not be loaded"},
    {NULL},
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT, "_fastlaunch",
    "ge2jit's compiled launch path (see ge2jit.jit.fastlaunch).", -1, module_methods,
    NULL, NULL, NULL, NULL,
};

PyMODINIT_FUNC PyInit__fastlaunch(void) {
    if (PyType_Ready(&TableType) < 0 || PyType_Ready(&ProgramType) < 0)
        return NULL;
    PyObject *m = PyModule_Create(&module);
    if (!m)
        return NULL;
    kinds = PyDict_New();
    MISS = PyObject_CallNoArgs((PyObject *)&PyBaseObject_Type);
    if (!kinds || !MISS)
        return NULL;
#define INTERN(v, s) if (!(v = PyUnicode_InternFromString(s))) return NULL
    INTERN(s_data, "data");
    INTERN(s_ptr, "ptr");
    INTERN(s_device_id, "device_id");
    INTERN(s_shape, "shape");
    INTERN(s_strides, "strides");
    INTERN(s_dtype, "dtype");
    INTERN(s_data_ptr, "data_ptr");
    INTERN(s_get_device, "get_device");
    INTERN(s_stride, "stride");
#undef INTERN
    for (int i = 0; i < 17; i++)
        if (!(small_ints[i] = PyLong_FromLong(i)))
            return NULL;
    Py_INCREF(&TableType);
    Py_INCREF(&ProgramType);
    if (PyModule_AddObject(m, "Table", (PyObject *)&TableType) < 0 ||
        PyModule_AddObject(m, "Program", (PyObject *)&ProgramType) < 0 ||
        PyModule_AddIntConstant(m, "OP_CONST", OP_CONST) < 0 ||
        PyModule_AddIntConstant(m, "OP_PTR", OP_PTR) < 0 ||
        PyModule_AddIntConstant(m, "OP_F64", OP_F64) < 0 ||
        PyModule_AddIntConstant(m, "OP_TMAP", OP_TMAP) < 0 ||
        PyModule_AddIntConstant(m, "KIND_CUPY", KIND_CUPY) < 0 ||
        PyModule_AddIntConstant(m, "KIND_TORCH", KIND_TORCH) < 0)
        return NULL;
    return m;
}
