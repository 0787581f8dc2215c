//! Settles the promises of the binding from tokio through one threadsafe function per JS
//! thread (docs/decisions/0014).
//!
//! napi-rs's `Env::spawn_future` creates, refs and tears down a threadsafe function (a
//! uv_async handle) for every promise. On the lock's hot path that was most of the Node CPU
//! per acquire/release pair. Here one threadsafe function lives as long as the JS thread's
//! environment, and completions queue beside it: one call of it per batch, made when the
//! queue stops being empty, and the JS thread settles the whole batch in that one call.
//! While many other replies are due, that call waits for the end of the runtime's turn, so
//! the batch holds every settlement of the turn (decision 0188). It is ref'd only while
//! promises of that thread are pending, so it keeps Node alive exactly as a pending
//! promise should, and never after.

use std::cell::Cell;
use std::ffi::c_void;
use std::future::{poll_fn, Future};
use std::panic::AssertUnwindSafe;
use std::ptr;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::task::Poll;
use std::time::{Duration, Instant};

use futures::task::AtomicWaker;
use futures::FutureExt;
use napi::bindgen_prelude::*;
use napi::sys;

/// One JS thread's settler.
struct Settler {
    /// The threadsafe function's address while its environment lives; `None` from the
    /// moment Node finalizes it (environment teardown), so no task calls a freed one: the
    /// runtime's thread holds this lock while it calls it, and the finalizer waits for it.
    tsfn: Mutex<Option<usize>>,
    /// The same address (0 once finalized) for the JS thread alone, which makes and
    /// finalizes it and so needs no lock to read it. Read through the lock, each call's
    /// check waited while the runtime's thread held it across a call of the threadsafe
    /// function (a system call): 1.5 % of the JS thread at 64 in flight (issue 37).
    tsfn_here: AtomicUsize,
    /// Settlements made on the runtime, not yet on the JS thread. The threadsafe function
    /// is called when this goes from empty to not; that call settles all it then holds, so
    /// Node's queue, handle scope and callback scope are paid per batch, not per promise
    /// (napi and the settler were ~13 % of the JS thread at 64 in flight:
    /// benchmarks/results/2026-12-06-where-it-goes.md).
    queue: Mutex<Vec<Settlement>>,
}

type Handle = Arc<Settler>;

thread_local! {
    // One per JS thread: the main thread and each worker have their own environment.
    static SETTLER: std::cell::RefCell<Option<Handle>> = const { std::cell::RefCell::new(None) };
    static PENDING: Cell<usize> = const { Cell::new(0) };
}

/// Promises of every JS thread whose task has not finished yet: replies are due.
static DUE: AtomicUsize = AtomicUsize::new(0);

/// How long the runtime's thread stays awake, polling, while a reply is due and after the
/// last one came (issue 12, target 4): a parked thread is woken by the reply, and again by
/// the next call (a release right after its acquire), and on an idle VM each wake-up costs
/// about as much as a Redis round trip. `DOKEBI_LOCK_REDIS_STAY_AWAKE_US` sets it for
/// experiments; 0 turns it off (docs/decisions/0041, docs/perf/README.md).
fn stay_awake_for() -> Duration {
    crate::switches::stay_awake()
}

/// With more replies due than this, the thread is busy anyway: polling would only take a
/// core from Redis and the JS thread. With this many or fewer, the spin may run, and a JS
/// thread is woken at once for a settlement, not at the end of the turn (decision 0188).
const STAY_AWAKE_MAX_DUE: usize = 2;

/// Whether a [`stay_awake`] task runs now (one at a time).
static AWAKE: AtomicBool = AtomicBool::new(false);

/// Replies due now: pending promises less the acquires that wait (for their turn, or
/// between attempts) and so expect none (docs/decisions/0184).
fn due() -> usize {
    DUE.load(Ordering::Relaxed).saturating_sub(crate::awake::waiting())
}

/// Starts the spin if few replies are due now and it does not run yet.
fn spin_if_few_due(runtime: &tokio::runtime::Handle) {
    if due() <= STAY_AWAKE_MAX_DUE
        && !stay_awake_for().is_zero()
        && !AWAKE.swap(true, Ordering::AcqRel)
    {
        runtime.spawn(stay_awake(stay_awake_for()));
    }
}

/// A waiting acquire is about to make an attempt (`crate::awake`): its reply, on its way
/// soon, should find the thread awake as a call's does. Runs on the runtime.
fn spin_for_attempt() {
    if let Ok(runtime) = tokio::runtime::Handle::try_current() {
        spin_if_few_due(&runtime);
    }
}

/// Yields in a loop, so every turn polls the I/O driver without blocking: a reply, or a
/// call spawned from JS, finds the thread awake. Ends `spin` after the last reply, at once
/// when many are due, and after `20 × spin` of one reply that does not come (a slow server).
/// Waiting acquires expect no reply and do not count ([`due`]).
async fn stay_awake(spin: Duration) {
    let started = Instant::now();
    let mut idle_since: Option<Instant> = None;
    loop {
        let now = Instant::now();
        let done = match due() {
            0 => now >= *idle_since.get_or_insert(now) + spin,
            due if due > STAY_AWAKE_MAX_DUE => true,
            _ => {
                idle_since = None;
                now >= started + spin * 20
            }
        };
        if done {
            break;
        }
        // The kernel tends to wake the JS thread on the CPU of the thread that woke it, this
        // one: without giving that CPU up at each turn, the JS thread would wait for the
        // spin to end, up to 2 ms (docs/decisions/0183).
        std::thread::yield_now();
        tokio::task::yield_now().await;
    }
    AWAKE.store(false, Ordering::Release);
}

/// One settlement, made on the JS thread.
struct Settlement {
    deferred: usize,
    value: Box<dyn FnOnce(sys::napi_env) -> Result<sys::napi_value> + Send>,
}

unsafe extern "C" fn settle_batch(
    env: sys::napi_env,
    _js: sys::napi_value,
    context: *mut c_void,
    _data: *mut c_void,
) {
    let settler = unsafe { &*(context as *const Settler) };
    let batch = std::mem::take(&mut *lock(&settler.queue));
    // A null env: the environment is being torn down; the promises go with it.
    if env.is_null() {
        return;
    }
    let settled = batch.len();
    for settlement in batch {
        let deferred = settlement.deferred as sys::napi_deferred;
        unsafe {
            match (settlement.value)(env) {
                Ok(value) => sys::napi_resolve_deferred(env, deferred, value),
                Err(err) => {
                    sys::napi_reject_deferred(env, deferred, JsError::from(err).into_value(env))
                }
            };
        }
    }
    let left = PENDING.with(|p| {
        let left = p.get().saturating_sub(settled);
        p.set(left);
        left
    });
    if left == 0 && settled > 0 {
        // Nothing pending on this thread: the settler must not keep Node alive.
        let tsfn = settler.tsfn_here.load(Ordering::Relaxed);
        if tsfn != 0 {
            unsafe {
                sys::napi_unref_threadsafe_function(env, tsfn as sys::napi_threadsafe_function)
            };
        }
    }
}

unsafe extern "C" fn finalize(_env: sys::napi_env, data: *mut c_void, _hint: *mut c_void) {
    let handle = unsafe { Arc::from_raw(data as *const Settler) };
    handle.tsfn_here.store(0, Ordering::Relaxed);
    *lock(&handle.tsfn) = None;
    lock(&handle.queue).clear();
}

unsafe extern "C" fn has_ref_cb(
    env: sys::napi_env,
    _info: sys::napi_callback_info,
) -> sys::napi_value {
    let mut result = ptr::null_mut();
    let pending = PENDING.with(|p| p.get()) > 0;
    unsafe { sys::napi_get_boolean(env, pending, &mut result) };
    result
}

fn lock<T>(mutex: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    crate::sync::lock(mutex)
}

/// This thread's settler, created on first use.
fn settler(env: sys::napi_env) -> Result<Handle> {
    if let Some(handle) = SETTLER.with(|s| s.borrow().clone()) {
        if handle.tsfn_here.load(Ordering::Relaxed) != 0 {
            return Ok(handle);
        }
    }
    let handle: Handle = Arc::new(Settler {
        tsfn: Mutex::new(None),
        tsfn_here: AtomicUsize::new(0),
        queue: Mutex::new(Vec::new()),
    });
    let context = Arc::as_ptr(&handle) as *mut c_void;
    let mut name = ptr::null_mut();
    let mut tsfn = ptr::null_mut();
    let mut resource = ptr::null_mut();
    let mut has_ref = ptr::null_mut();
    unsafe {
        check(sys::napi_create_string_utf8(env, c"dokebi-lock-redis".as_ptr(), 17, &mut name))?;
        // async_hooks see the settler as a resource for as long as the environment lives;
        // `hasRef()` tells tools such as Jest's --detectOpenHandles whether it holds Node
        // open now (only while promises are pending), as Node's own handles do.
        check(sys::napi_create_object(env, &mut resource))?;
        check(sys::napi_create_function(
            env,
            c"hasRef".as_ptr(),
            6,
            Some(has_ref_cb),
            ptr::null_mut(),
            &mut has_ref,
        ))?;
        check(sys::napi_set_named_property(env, resource, c"hasRef".as_ptr(), has_ref))?;
        // The finalizer holds its own reference, released when Node finalizes.
        let finalize_data = Arc::into_raw(handle.clone()) as *mut c_void;
        let created = sys::napi_create_threadsafe_function(
            env,
            ptr::null_mut(),
            resource,
            name,
            0,
            1,
            finalize_data,
            Some(finalize),
            context,
            Some(settle_batch),
            &mut tsfn,
        );
        if created != sys::Status::napi_ok {
            drop(Arc::from_raw(finalize_data as *const Settler));
            return Err(Error::new(Status::from(created), "the settler could not be created"));
        }
        check(sys::napi_unref_threadsafe_function(env, tsfn))?;
    }
    *lock(&handle.tsfn) = Some(tsfn as usize);
    handle.tsfn_here.store(tsfn as usize, Ordering::Relaxed);
    PENDING.with(|p| p.set(0));
    crate::awake::on_attempt(spin_for_attempt);
    SETTLER.with(|s| *s.borrow_mut() = Some(handle.clone()));
    Ok(handle)
}

/// Calls `settler`'s threadsafe function: its JS thread wakes and settles the whole batch.
fn wake_js(settler: &Settler) {
    let guard = lock(&settler.tsfn);
    let called = match *guard {
        Some(tsfn) => unsafe {
            sys::napi_call_threadsafe_function(
                tsfn as sys::napi_threadsafe_function,
                ptr::null_mut(),
                sys::ThreadsafeFunctionCallMode::nonblocking,
            ) == sys::Status::napi_ok
        },
        None => false,
    };
    drop(guard);
    if !called {
        // The environment is gone (or going): nobody can observe these promises.
        lock(&settler.queue).clear();
    }
}

/// Settlers whose JS thread is woken once the runtime's thread has run every task ready now
/// (decision 0188).
struct TurnEnd {
    settlers: Mutex<Vec<Handle>>,
    /// The [`wake_at_turn_end`] task, woken when `settlers` stops being empty.
    waker: AtomicWaker,
}

static TURN_END: TurnEnd = TurnEnd { settlers: Mutex::new(Vec::new()), waker: AtomicWaker::new() };

/// Started on first use; it runs as long as the runtime (the process).
static TURN_END_STARTED: std::sync::Once = std::sync::Once::new();

/// Wakes `settler`'s JS thread at the end of the runtime's turn. Runs on the runtime.
fn wake_js_at_turn_end(settler: Handle) {
    TURN_END_STARTED.call_once(|| {
        tokio::spawn(wake_at_turn_end());
    });
    let first = {
        let mut settlers = lock(&TURN_END.settlers);
        settlers.push(settler);
        settlers.len() == 1
    };
    if first {
        TURN_END.waker.wake();
    }
}

/// The one task that wakes JS threads at the end of a turn. `yield_now` puts it behind
/// every task that is ready and behind a poll of the I/O driver (tokio defers a yielded
/// task until the worker runs out of work, or at its next I/O check, 61 tasks later at
/// most): a settlement made meanwhile joins the batch the JS thread is woken for.
async fn wake_at_turn_end() {
    loop {
        poll_fn(|cx| {
            // Registered before the list is read: a settler pushed after it wakes us.
            TURN_END.waker.register(cx.waker());
            if lock(&TURN_END.settlers).is_empty() {
                Poll::Pending
            } else {
                Poll::Ready(())
            }
        })
        .await;
        tokio::task::yield_now().await;
        let settlers = std::mem::take(&mut *lock(&TURN_END.settlers));
        for settler in settlers {
            wake_js(&settler);
        }
    }
}

fn check(status: sys::napi_status) -> Result<()> {
    if status == sys::Status::napi_ok {
        Ok(())
    } else {
        Err(Error::new(Status::from(status), "a napi call of the settler failed"))
    }
}

/// Like `env.spawn_future`: runs `future` on `runtime` and resolves the returned promise
/// with its output on this JS thread. A panic settles it with `on_panic()` (a LockError
/// that says an internal error happened) instead of leaving it pending forever, which
/// would also keep Node alive.
pub fn spawn<'env, T, F>(
    env: &'env Env,
    runtime: &tokio::runtime::Handle,
    future: F,
    on_panic: fn() -> T,
) -> Result<PromiseRaw<'env, T>>
where
    T: ToNapiValue + Send + 'static,
    F: Future<Output = T> + Send + 'static,
{
    let (promise, task) = settled_by(env, runtime, future, on_panic)?;
    super::dispatch::run(task, runtime);
    Ok(promise)
}

/// A new promise of this JS thread, and the task that runs `future` and settles it: for
/// a caller that spawns the task itself (e.g. as one of a driver's tracked tasks, so that
/// the work and the settling run in one task). [`spawn`] spawns it on the runtime.
pub fn settled_by<'env, T, F>(
    env: &'env Env,
    runtime: &tokio::runtime::Handle,
    future: F,
    on_panic: fn() -> T,
) -> Result<(PromiseRaw<'env, T>, impl Future<Output = ()> + Send + 'static)>
where
    T: ToNapiValue + Send + 'static,
    F: Future<Output = T> + Send + 'static,
{
    let raw_env = env.raw();
    let handle = settler(raw_env)?;
    let mut deferred = ptr::null_mut();
    let mut promise = ptr::null_mut();
    unsafe { check(sys::napi_create_promise(raw_env, &mut deferred, &mut promise))? };
    // Counted only once the ref (for the first pending promise) took: a count left too high
    // would keep the settler ref'd, and Node alive, for good.
    if PENDING.with(|p| p.get()) == 0 {
        let tsfn = handle.tsfn_here.load(Ordering::Relaxed);
        if tsfn != 0 {
            unsafe {
                check(sys::napi_ref_threadsafe_function(
                    raw_env,
                    tsfn as sys::napi_threadsafe_function,
                ))?
            };
        }
    }
    PENDING.with(|p| p.set(p.get() + 1));
    let deferred = deferred as usize;
    DUE.fetch_add(1, Ordering::Relaxed);
    spin_if_few_due(runtime);
    let task = async move {
        let value: Box<dyn FnOnce(sys::napi_env) -> Result<sys::napi_value> + Send> =
            match AssertUnwindSafe(future).catch_unwind().await {
                Ok(output) => Box::new(move |env| unsafe { T::to_napi_value(env, output) }),
                Err(_) => {
                    let output = on_panic();
                    Box::new(move |env| unsafe { T::to_napi_value(env, output) })
                }
            };
        DUE.fetch_sub(1, Ordering::Relaxed);
        let first = {
            let mut queue = lock(&handle.queue);
            queue.push(Settlement { deferred, value });
            queue.len() == 1
        };
        if first {
            // Woken at the first settlement of a turn, the JS thread took it alone, while
            // the runtime's thread settled the rest, and it was woken again for them; the
            // thread woken also blocked on the threadsafe function's lock, held by the call
            // that woke it. With few other replies due there is little to wait for, and the
            // stay-awake spin may run: behind its `sched_yield`, a wake at the turn's end
            // would come after another process's time slice (decision 0188).
            if due() <= STAY_AWAKE_MAX_DUE {
                wake_js(&handle);
            } else {
                wake_js_at_turn_end(handle);
            }
        }
    };
    Ok((PromiseRaw::new(raw_env, promise), task))
}
