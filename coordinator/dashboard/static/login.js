// Login: post an API token to /ui/session; the server answers with an HttpOnly cookie.
// Also used by app.js: a link like /ui#token=TOKEN logs in and clears the token from
// the address bar (and from the history) before anything else happens.

/** Open a dashboard session with `token`; resolves to null, or the error line to show. */
export async function openSession(token) {
  const response = await fetch("/ui/session", {
    method: "POST",
    headers: { "Content-Type": "application/json" },
    body: JSON.stringify({ token }),
    credentials: "same-origin",
  });
  if (response.status === 204) return null;
  try {
    return (await response.json()).detail || `login failed (HTTP ${response.status})`;
  } catch {
    return `login failed (HTTP ${response.status})`;
  }
}

/** The token of a `#token=...` address, removed from the address bar; else null. */
export function takeHashToken() {
  if (!location.hash.startsWith("#token=")) return null;
  const token = decodeURIComponent(location.hash.slice("#token=".length));
  history.replaceState(null, "", location.pathname + location.search);
  return token || null;
}

function showError(text) {
  document.getElementById("login-error").textContent = text;
}

async function logIn(token) {
  showError("");
  let error;
  try {
    error = await openSession(token);
  } catch {
    error = "the coordinator cannot be reached; check it is running and retry";
  }
  if (error === null) location.replace("/ui");
  else showError(error);
}

const form = document.getElementById("login-form");
if (form) {
  form.addEventListener("submit", (event) => {
    event.preventDefault();
    logIn(document.getElementById("token").value.trim());
  });
  const fromHash = () => {
    const token = takeHashToken();
    if (token) logIn(token);
  };
  // A #token= link pasted into this tab changes only the fragment: no reload, so listen.
  window.addEventListener("hashchange", fromHash);
  fromHash();
}
