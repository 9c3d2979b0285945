//! One id per HTTP session: the `Mcp-Session-Id` the client is given is
//! the id the session's audit records, credentials and workspace carry.
//!
//! rmcp makes the service of a new session (a [`Session`](crate::Session),
//! with its id) before its session manager names the session. The
//! sessions' layer picks the id first ([`with_new_id`]) and both read it:
//! the gateway's session factory ([`new_id`]) and [`IdSessions`], which
//! creates rmcp's session under it and leaves every other operation to
//! rmcp's [`LocalSessionManager`].

use std::sync::Arc;

use futures_core::Stream;
use rmcp::model::{ClientJsonRpcMessage, ServerJsonRpcMessage};
use rmcp::transport::WorkerTransport;
use rmcp::transport::streamable_http_server::session::local::{
    LocalSessionManager, LocalSessionManagerError, LocalSessionWorker, create_local_session,
};
use rmcp::transport::streamable_http_server::session::{
    ServerSseMessage, SessionId, SessionManager,
};

tokio::task_local! {
    static NEW_ID: SessionId;
}

/// Run `f` (a request that may open a session) with the id a session it
/// opens gets.
pub(crate) async fn with_new_id<F: std::future::Future>(f: F) -> F::Output {
    NEW_ID
        .scope(rmcp::transport::common::server_side_http::session_id(), f)
        .await
}

/// The id a session opened by the current request gets, if the request
/// runs under [`with_new_id`].
pub(crate) fn new_id() -> Option<String> {
    NEW_ID.try_with(|id| id.to_string()).ok()
}

/// rmcp's local session manager, creating each session under the id
/// [`with_new_id`] picked (a fresh one outside it).
pub(crate) struct IdSessions {
    pub(crate) inner: Arc<LocalSessionManager>,
}

impl SessionManager for IdSessions {
    type Error = LocalSessionManagerError;
    type Transport = WorkerTransport<LocalSessionWorker>;

    async fn create_session(&self) -> Result<(SessionId, Self::Transport), Self::Error> {
        let id = NEW_ID
            .try_with(|id| id.clone())
            .unwrap_or_else(|_| rmcp::transport::common::server_side_http::session_id());
        let (handle, worker) = create_local_session(id.clone(), self.inner.session_config.clone());
        self.inner.sessions.write().await.insert(id.clone(), handle);
        Ok((id, WorkerTransport::spawn(worker)))
    }

    async fn initialize_session(
        &self,
        id: &SessionId,
        message: ClientJsonRpcMessage,
    ) -> Result<ServerJsonRpcMessage, Self::Error> {
        self.inner.initialize_session(id, message).await
    }

    async fn has_session(&self, id: &SessionId) -> Result<bool, Self::Error> {
        self.inner.has_session(id).await
    }

    async fn close_session(&self, id: &SessionId) -> Result<(), Self::Error> {
        self.inner.close_session(id).await
    }

    async fn create_stream(
        &self,
        id: &SessionId,
        message: ClientJsonRpcMessage,
    ) -> Result<impl Stream<Item = ServerSseMessage> + Send + Sync + 'static, Self::Error> {
        self.inner.create_stream(id, message).await
    }

    async fn accept_message(
        &self,
        id: &SessionId,
        message: ClientJsonRpcMessage,
    ) -> Result<(), Self::Error> {
        self.inner.accept_message(id, message).await
    }

    async fn create_standalone_stream(
        &self,
        id: &SessionId,
    ) -> Result<impl Stream<Item = ServerSseMessage> + Send + Sync + 'static, Self::Error> {
        self.inner.create_standalone_stream(id).await
    }

    async fn resume(
        &self,
        id: &SessionId,
        last_event_id: String,
    ) -> Result<impl Stream<Item = ServerSseMessage> + Send + Sync + 'static, Self::Error> {
        self.inner.resume(id, last_event_id).await
    }
}
