//! The slots' view of a kind of child: [`Child`] behind vtables ([`Kind`], [`Object`]), and
//! its jobs as [`AnyJob`]s in the line, so that the slots' loop is compiled once for every kind
//! of child (a copy per kind made the release binary grow).

use std::any::Any;
use std::future::Future;
use std::io;
use std::pin::Pin;
use std::sync::Arc;

use nix::sys::signal::Signal;

use super::{Alive, Child, JobLine, Said, Served, Serving, Watch};
use crate::process::reaper::Exit;

pub(super) type BoxFuture<'a, T> = Pin<Box<dyn Future<Output = T> + Send + 'a>>;

/// A job on its way from the line to its child, its type erased.
pub(super) type AnyJob = Box<dyn Any + Send>;

/// A kind of child as the slots see it: how to start one.
pub(super) trait Kind: Send + Sync {
    fn start(&self, slot: usize) -> io::Result<Box<dyn Object>>;
    /// Logs why starting failed, and tells the mode.
    fn start_failed(&self, said: Said, error: &io::Error);
}

/// [`Kind`] of the children `C`.
pub(super) struct KindOf<C: Child> {
    pub(super) spec: Arc<C::Spec>,
    pub(super) line: Arc<JobLine<C::Job>>,
}

impl<C: Child> Kind for KindOf<C> {
    fn start(&self, slot: usize) -> io::Result<Box<dyn Object>> {
        let child = C::start(&self.spec, slot)?;
        Ok(Box::new(Typed {
            child,
            line: self.line.clone(),
        }))
    }

    fn start_failed(&self, said: Said, error: &io::Error) {
        said.failed_to_start(C::command(&self.spec), error);
        C::start_failed(&self.spec, said.slot, error);
    }
}

/// What stopping a child takes, behind one vtable.
pub(super) trait Stopping: Send {
    fn process_id(&self) -> i32;
    fn send(&mut self, signal: Signal);
    fn exit(&mut self) -> BoxFuture<'_, Exit>;
}

impl<C: Child> Stopping for C {
    fn process_id(&self) -> i32 {
        self.pid()
    }

    fn send(&mut self, signal: Signal) {
        self.signal(signal);
    }

    fn exit(&mut self) -> BoxFuture<'_, Exit> {
        Box::pin(self.wait())
    }
}

/// A child as the slots see it (see [`Kind`]).
pub(super) trait Object: Send {
    fn stopping(&mut self) -> &mut dyn Stopping;
    fn ready(&mut self) -> BoxFuture<'_, Result<(), Exit>>;
    fn wants_job(&self) -> bool;
    fn watch<'a>(&'a mut self, cx: Cx<'a>) -> BoxFuture<'a, Watch>;
    fn serve<'a>(&'a mut self, job: AnyJob, cx: Cx<'a>) -> BoxFuture<'a, Served>;
    fn close(&mut self);
    fn stopped(&mut self, exit: Exit);
}

/// What a slot hands its child with each watch and job: see [`Serving`].
pub(super) struct Cx<'a> {
    pub(super) alive: &'a mut Option<Alive>,
    pub(super) served: u64,
}

/// A child `C` and the line its jobs come from.
pub(super) struct Typed<C: Child> {
    child: C,
    line: Arc<JobLine<C::Job>>,
}

impl<C: Child> Object for Typed<C> {
    fn stopping(&mut self) -> &mut dyn Stopping {
        &mut self.child
    }

    fn ready(&mut self) -> BoxFuture<'_, Result<(), Exit>> {
        Box::pin(self.child.ready())
    }

    fn wants_job(&self) -> bool {
        self.child.wants_job()
    }

    fn watch<'a>(&'a mut self, cx: Cx<'a>) -> BoxFuture<'a, Watch> {
        Box::pin(async move {
            let mut cx = Serving {
                line: &self.line,
                alive: cx.alive,
                served: cx.served,
            };
            self.child.watch(&mut cx).await
        })
    }

    fn serve<'a>(&'a mut self, job: AnyJob, cx: Cx<'a>) -> BoxFuture<'a, Served> {
        Box::pin(async move {
            // Always a `C::Job`: the slot took it from this kind's line.
            let Ok(job) = job.downcast::<C::Job>() else {
                return Served::Dropped;
            };
            let mut cx = Serving {
                line: &self.line,
                alive: cx.alive,
                served: cx.served,
            };
            self.child.serve(*job, &mut cx).await
        })
    }

    fn close(&mut self) {
        self.child.close();
    }

    fn stopped(&mut self, exit: Exit) {
        self.child.stopped(exit);
    }
}
