// Signing in: a login form for the server's Basic users (name and password) or a JWT, shown
// when the server asks for credentials (HTTP 401, or a connection closed with 4001).
//
// A token is kept in session storage (it expires by itself, and a reload keeps working); a
// password is kept in memory only, so a reload asks for it again. A `#token=<jwt>` fragment in
// the page URL (never sent to the server or its logs) signs in directly, without the form.

import type { Credentials } from 'switchboard-sdk';
import { h } from './dom.js';

const TOKEN_KEY = 'switchboard.token';

/** What the user signed in with. */
export type Credential = { kind: 'token'; token: string } | { kind: 'basic'; user: string; password: string };

/** Checks an `Authorization` header value against the server: null when accepted, else why not. */
export type Verifier = (authorization: string) => Promise<string | null>;

function base64Utf8(s: string): string {
  let bin = '';
  for (const b of new TextEncoder().encode(s)) bin += String.fromCharCode(b);
  return btoa(bin);
}

export class Login {
  readonly el: HTMLElement;
  private cred: Credential | null = null;
  private readonly user: HTMLInputElement;
  private readonly password: HTMLInputElement;
  private readonly token: HTMLInputElement;
  private readonly message: HTMLElement;
  private readonly submit: HTMLButtonElement;
  private waiting: (() => void) | null = null;

  constructor(private readonly verify: Verifier) {
    const m = /(?:^|[#&])token=([^&]+)/.exec(location.hash);
    if (m) {
      sessionStorage.setItem(TOKEN_KEY, decodeURIComponent(m[1]));
      history.replaceState(null, '', location.pathname + location.search);
    }
    const stored = sessionStorage.getItem(TOKEN_KEY);
    if (stored) this.cred = { kind: 'token', token: stored };

    this.user = h('input', { id: 'login-user', name: 'username', autocomplete: 'username', placeholder: 'user' });
    this.password = h('input', { id: 'login-password', type: 'password', name: 'password', autocomplete: 'current-password', placeholder: 'password' });
    this.token = h('input', { id: 'login-token', autocomplete: 'off', placeholder: 'or paste a token (JWT)' });
    this.message = h('p', { id: 'login-message', className: 'login-message' });
    this.submit = h('button', { type: 'submit', id: 'login-submit', textContent: 'Sign in' });
    const form = h('form', { id: 'login', className: 'login' }, [
      h('h2', { textContent: 'Sign in to Switchboard' }),
      h('label', {}, [h('span', { textContent: 'User' }), this.user]),
      h('label', {}, [h('span', { textContent: 'Password' }), this.password]),
      h('label', {}, [h('span', { textContent: 'Token' }), this.token]),
      this.message,
      this.submit,
    ]);
    form.addEventListener('submit', (e) => {
      e.preventDefault();
      void this.trySignIn();
    });
    this.el = h('div', { className: 'login-overlay hidden', id: 'login-overlay' }, [form]);
  }

  /** The `Authorization` header value for the HTTP API, or null when not signed in. */
  authorization(): string | null {
    const c = this.cred;
    if (!c) return null;
    return c.kind === 'token' ? `Bearer ${c.token}` : `Basic ${base64Utf8(`${c.user}:${c.password}`)}`;
  }

  /** The token for the SDK's `connect` ('' when signed in with a password or not at all). */
  bearer(): string {
    return this.cred?.kind === 'token' ? this.cred.token : '';
  }

  /** The Basic credentials for the SDK's `connect`, if signed in with a password. */
  basic(): Credentials | undefined {
    const c = this.cred;
    return c?.kind === 'basic' ? { user: c.user, password: c.password } : undefined;
  }

  /** Who is signed in, for the bar. */
  who(): string {
    const c = this.cred;
    if (!c) return '';
    if (c.kind === 'basic') return c.user;
    try {
      const claims = JSON.parse(atob(c.token.split('.')[1].replace(/-/g, '+').replace(/_/g, '/'))) as { sub?: string };
      return claims.sub ?? 'token';
    } catch {
      return 'token';
    }
  }

  signedIn(): boolean {
    return this.cred !== null;
  }

  /** Forgets the credentials (and the stored token). */
  signOut(): void {
    this.cred = null;
    sessionStorage.removeItem(TOKEN_KEY);
  }

  /** Shows the form (with why, if given) and resolves once the server accepted what was entered. */
  ask(why = ''): Promise<void> {
    this.signOut();
    this.message.textContent = why;
    this.message.classList.toggle('error', why !== '');
    this.el.classList.remove('hidden');
    this.user.focus();
    return new Promise((resolve) => {
      this.waiting = resolve;
    });
  }

  private async trySignIn(): Promise<void> {
    const token = this.token.value.trim();
    const user = this.user.value.trim();
    let cred: Credential;
    if (token) cred = { kind: 'token', token };
    else if (user && this.password.value) cred = { kind: 'basic', user, password: this.password.value };
    else {
      this.say('enter a user and password, or a token');
      return;
    }
    this.submit.disabled = true;
    this.say('signing in…', false);
    const previous = this.cred;
    this.cred = cred;
    let refused: string | null;
    try {
      refused = await this.verify(this.authorization() ?? '');
    } catch (e) {
      refused = `server unreachable: ${(e as Error).message}`;
    }
    this.submit.disabled = false;
    if (refused !== null) {
      this.cred = previous;
      this.say(refused);
      return;
    }
    if (cred.kind === 'token') sessionStorage.setItem(TOKEN_KEY, cred.token);
    this.password.value = '';
    this.token.value = '';
    this.say('', false);
    this.el.classList.add('hidden');
    const done = this.waiting;
    this.waiting = null;
    done?.();
  }

  private say(text: string, error = true): void {
    this.message.textContent = text;
    this.message.classList.toggle('error', error && text !== '');
  }
}
